"""An asyncio event loop on a virtual clock.

`asyncio.sleep`, `wait_for` timeouts and every timer run on simulated seconds: when no callback is ready the loop jumps
straight to the next timer instead of waiting. A 5-minute trainer cold start therefore costs no wall time.

Interleaving: by default the ready queue is FIFO and timers due together fire in asyncio's heap order (fixed, though not
always insertion order). With `tie_break_seed`, the
callbacks ready in one loop iteration (tasks woken at the same virtual instant, timers due together) run in an order
drawn from that seed instead (TigerBeetle's VOPR: the seed picks the interleaving), so one seed is one interleaving,
the same on every run, and another seed explores another. Threads and real I/O are not simulated: a fake that needs
them does not belong on this loop.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import random
import selectors
import weakref
from collections.abc import Coroutine
from typing import Any


class SimulationDeadlock(RuntimeError):
    """Every task is waiting and no timer is pending: nothing can ever make progress."""


class _VirtualSelector(selectors.BaseSelector):
    """Never reports I/O readiness; a select with a timeout advances the loop's clock by that timeout."""

    def __init__(self) -> None:
        self._keys: dict[int, selectors.SelectorKey] = {}
        self.loop: VirtualTimeLoop | None = None

    @staticmethod
    def _fd(fileobj: Any) -> int:
        return fileobj if isinstance(fileobj, int) else fileobj.fileno()

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        key = selectors.SelectorKey(fileobj, self._fd(fileobj), events, data)
        self._keys[key.fd] = key
        return key

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._keys.pop(self._fd(fileobj))

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        assert self.loop is not None
        if timeout is None:
            raise SimulationDeadlock(
                "all simulated tasks are blocked and no timer is pending: a future is awaited that nothing will resolve"
            )
        if timeout > 0:
            self.loop.advance(timeout)
        ready = self.loop._ready
        if isinstance(ready, _ShuffledReady):
            ready.new_batch()
        return []

    def get_map(self) -> dict[int, selectors.SelectorKey]:  # type: ignore[override]
        return self._keys

    def close(self) -> None:
        self._keys.clear()


class _ShuffledReady(collections.deque):
    """The loop's ready queue, popped in a seeded order within each batch.

    asyncio's `_run_once` selects, moves due timers onto the ready queue, then pops exactly the callbacks that were
    ready at that moment (later `call_soon`s wait for the next iteration). The selector marks each new iteration;
    the first pop sizes the batch, and every pop takes a seeded pick among what is left of it, never a newcomer.
    """

    def __init__(self, seed: int) -> None:
        super().__init__()
        self._rng = random.Random(seed)
        self._left = -1  # -1: the next pop starts a batch

    def new_batch(self) -> None:
        self._left = -1

    def popleft(self) -> object:
        if self._left < 0:
            self._left = len(self)
        if self._left <= 1:
            self._left -= 1
            return super().popleft()
        index = self._rng.randrange(self._left)
        self._left -= 1
        if index == 0:
            return super().popleft()
        item = self[index]
        del self[index]
        return item


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """A selector event loop whose `time()` is a virtual clock starting at 0.0 seconds.

    `tie_break_seed`: None runs ready callbacks first-in first-out; an int shuffles each batch of simultaneously ready
    callbacks in the order that seed draws.
    """

    def __init__(self, tie_break_seed: int | None = None) -> None:
        self._virtual_now = 0.0
        selector = _VirtualSelector()
        super().__init__(selector)
        selector.loop = self
        if tie_break_seed is not None:
            self._ready = _ShuffledReady(tie_break_seed)
        # Timers due within this much of "now" fire together; coarser than float noise from repeated additions.
        self._clock_resolution = 1e-6
        self._births = itertools.count()
        self._born: weakref.WeakKeyDictionary[asyncio.Task[Any], int] = weakref.WeakKeyDictionary()

    def create_task(self, coro: Coroutine[Any, Any, Any], **kwargs: Any) -> asyncio.Task[Any]:
        task = super().create_task(coro, **kwargs)
        self._born[task] = next(self._births)
        return task

    def live_tasks(self) -> list[asyncio.Task[Any]]:
        """The loop's unfinished tasks, oldest first.

        `asyncio.all_tasks()` is a set, iterated in an order that follows memory addresses: cancelling tasks in that
        order made which exception each one ended with differ from process to process. (A task made with
        `asyncio.Task(...)` directly, not through the loop, sorts first.)"""
        return sorted((t for t in asyncio.all_tasks(self) if not t.done()), key=lambda t: self._born.get(t, -1))

    def time(self) -> float:
        return self._virtual_now

    def advance(self, seconds: float) -> None:
        self._virtual_now += seconds
