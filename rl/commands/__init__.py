"""The `rl` command's sub-commands, one module each, and what they share."""

from __future__ import annotations

from pathlib import Path


def user_path(text: str) -> Path:
    """A path as a user typed it (an argparse `type`): `~` expanded, relative to the current directory, made absolute.

    Absolute at parse time because stores hand out `file://` references (which a relative path cannot be) and a run
    directory's references must stay valid when a later command runs from another directory.
    """
    return Path(text).expanduser().absolute()
