"""`scope(group, name)`: the drivers' `flyte.group` role, or a no-op when no grouping is bound."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager

Group = Callable[[str], AbstractContextManager[object]]
"""`group(name)` is entered around a unit of a driver's work (an iteration, a step): `flyte.group` in production."""


def scope(group: Group | None, name: str) -> AbstractContextManager[object]:
    """`group(name)`, or a no-op when no grouping is bound."""
    return group(name) if group is not None else contextlib.nullcontext()
