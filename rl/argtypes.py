"""Argparse types that refuse bad input at parse time, so a bad flag never reaches a side effect: shared by `rl`'s
sub-commands and the other command lines the package ships (`python -m rl.conformance.recorded_history`, the peer
benchmark)."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from pathlib import Path


def user_path(text: str) -> Path:
    """A path as a user typed it (an argparse `type`): `~` expanded, relative to the current directory, made absolute.

    Absolute at parse time because stores hand out `file://` references (which a relative path cannot be) and a run
    directory's references must stay valid when a later command runs from another directory.
    """
    if not text.strip():
        # Path("") is ".": an empty --out (an unset shell variable) would silently run in the current folder.
        raise argparse.ArgumentTypeError("an empty path names no directory; pass one (e.g. --out runs/demo)")
    return Path(text).expanduser().absolute()


def int_at_least(low: int) -> Callable[[str], int]:
    """An argparse `type` for an integer flag that must be >= `low`, refused at parse time, before any side effect."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
        return value

    parse.__name__ = f"integer >= {low}"  # argparse names the type in its own messages
    return parse


positive_int = int_at_least(1)
non_negative_int = int_at_least(0)


def positive_float(text: str) -> float:
    """An argparse `type` for a finite float flag that must be > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return value
