"""`results_in_order(futures)`: `asyncio.gather`'s results, awaited the same way on every Python.

From 3.12 `gather` runs an already-finished future's callback at once, where 3.11 took a loop turn for it; on the
simulator's virtual loop that moved interleavings, so one seed gave two traces. Finished futures are read here
directly and only the pending ones are gathered, which both versions schedule alike.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")


async def results_in_order(futures: Sequence[asyncio.Future[T]]) -> list[T]:
    """Each future's result, in `futures`' order; raises a finished one's error at once, else the first that fails."""
    for fut in futures:
        if fut.done():
            fut.result()  # a finished failure (or cancellation) surfaces now, as gather would surface it first
    pending = [fut for fut in futures if not fut.done()]
    if pending:
        await asyncio.gather(*pending)
    return [fut.result() for fut in futures]
