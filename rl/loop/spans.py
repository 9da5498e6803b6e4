"""`scope(span, name)`: the drivers' `flyte.group` role, or a no-op when no span is bound."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager

Span = Callable[[str], AbstractContextManager[object]]
"""`span(name)` is entered around a unit of a driver's work (an iteration, a step): `flyte.group` in production."""


def scope(span: Span | None, name: str) -> AbstractContextManager[object]:
    """`span(name)`, or a no-op when no span is bound."""
    return span(name) if span is not None else contextlib.nullcontext()
