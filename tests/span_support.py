"""A stand-in for `flyte.group` in the span tests: a context that records the name of the span the code runs in."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

CURRENT: contextvars.ContextVar[str | None] = contextvars.ContextVar("span", default=None)


@contextlib.contextmanager
def recording_span(name: str) -> Iterator[None]:
    """What a driver's `span=` hook gets: while it is open, `CURRENT.get()` is `name`."""
    token = CURRENT.set(name)
    try:
        yield
    finally:
        CURRENT.reset(token)
