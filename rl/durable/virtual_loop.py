"""An asyncio event loop on a virtual clock.

`asyncio.sleep`, `wait_for` timeouts and every timer run on simulated seconds: when no callback is ready the loop jumps
straight to the next timer instead of waiting. A 5-minute trainer cold start therefore costs no wall time.

Interleaving: by default the ready queue is FIFO and timers due together fire in asyncio's heap order (fixed, though not
always insertion order). With `tie_break_seed`, the
callbacks ready in one loop iteration (tasks woken at the same virtual instant, timers due together) run in an order
drawn from that seed instead (TigerBeetle's VOPR: the seed picks the interleaving), so one seed is one interleaving,
the same on every run, and another seed explores another. Threads and real I/O are not simulated: a tier that needs
them does not belong on this loop.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import heapq
import inspect
import random
import selectors
from asyncio import base_events
from collections.abc import Callable
from contextvars import Context
from typing import Any, TypeVarTuple

from rl.errors import SimulationDeadlock, UnsupportedAsyncio

_Ts = TypeVarTuple("_Ts")


COPIED_RUN_ONCE = {
    "26970ce6b0d67ef5": "CPython 3.11",
    "22aebfb8172a0741": "CPython 3.13 (min/max written as if/elif; the same steps)",
}
"""sha256 prefixes of the `BaseEventLoop._run_once` sources `VirtualTimeLoop._run_once` was checked against."""


def run_once_digest(run_once: object) -> str | None:
    """The sha256 prefix of a `_run_once`'s source; None when its source cannot be read."""
    try:
        return hashlib.sha256(inspect.getsource(run_once).encode()).hexdigest()[:16]  # type: ignore[arg-type]
    except (OSError, TypeError):
        return None


def loop_path(run_once: object) -> str:
    """ "copied": our fast copy of `run_once` applies; "asyncio": run asyncio's own (slower, same order), which only
    needs it to select once per iteration and pop `_ready` from the left; else an `UnsupportedAsyncio` reason."""
    if run_once_digest(run_once) in COPIED_RUN_ONCE:
        return "copied"
    names = getattr(getattr(run_once, "__code__", None), "co_names", ())
    if {"_selector", "select", "_ready", "popleft", "_scheduled"} <= set(names):
        return "asyncio"
    return (
        "this Python's asyncio loop iteration no longer selects once and pops _ready: "
        "the simulator's virtual loop cannot drive it; run it on Python 3.11-3.13"
    )


LOOP_PATH = loop_path(base_events.BaseEventLoop._run_once)  # type: ignore[attr-defined]
"""Which `_run_once` this Python runs: decided once, at import."""


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
    callbacks in the order that seed draws. `path`: which iteration runs (`loop_path`; default this Python's).
    """

    def __new__(cls, tie_break_seed: int | None = None, path: str = LOOP_PATH) -> VirtualTimeLoop:
        if path not in ("copied", "asyncio"):  # refused before a loop exists, so no half-made loop is collected
            raise UnsupportedAsyncio(path)
        return super().__new__(cls)

    def __init__(self, tie_break_seed: int | None = None, path: str = LOOP_PATH) -> None:
        self._fast = path == "copied"
        self._virtual_now = 0.0
        selector = _VirtualSelector()
        super().__init__(selector)
        selector.loop = self
        if tie_break_seed is not None:
            self._ready = _ShuffledReady(tie_break_seed)
        # Timers due within this much of "now" fire together; coarser than float noise from repeated additions.
        self._clock_resolution = 1e-6
        self._created: dict[asyncio.Task[Any], int] = {}
        self._tasks_made = 0

    def create_task(self, coro: Any, **kwargs: Any) -> asyncio.Task[Any]:
        this: Any = self
        if not self._fast or this._debug or this._closed or this._task_factory is not None:
            task = super().create_task(coro, **kwargs)
        else:  # asyncio's create_task, less the checks that cannot fire with debug off and no task factory
            task = asyncio.Task(coro, loop=self, **kwargs)
        self._created[task] = self._tasks_made
        self._tasks_made += 1
        return task

    def tasks_in_creation_order(self) -> list[asyncio.Task[Any]]:
        """This loop's unfinished tasks in the order they were created.

        `asyncio.all_tasks` iterates a WeakSet, whose order follows memory addresses: cancelling in that order made
        the wake-ups after a driver's death, and so the event log, differ between processes for the same seed.
        """
        # Forget finished tasks here, so the index keeps no dead task alive (nor asyncio's WeakSet of tasks long).
        self._created = {t: n for t, n in self._created.items() if not t.done()}
        unknown = self._tasks_made  # a Task built directly, not through create_task: after the others
        return sorted(asyncio.all_tasks(self), key=lambda t: self._created.get(t, unknown))

    def close(self) -> None:
        self._created.clear()
        super().close()

    def time(self) -> float:
        return self._virtual_now

    def call_later(
        self,
        delay: float,
        callback: Callable[[*_Ts], object],
        *args: *_Ts,
        context: Context | None = None,
    ) -> asyncio.TimerHandle:
        """asyncio's `call_later` (`call_at(time() + delay)`) in one step when debug is off: the same timer, pushed
        on the same heap. Every `asyncio.sleep` of a simulated tier's latency comes through here."""
        this: Any = self
        if not self._fast or this._debug or this._closed or delay is None:
            return super().call_later(delay, callback, *args, context=context)
        timer = asyncio.TimerHandle(self._virtual_now + delay, callback, args, self, context)
        heapq.heappush(this._scheduled, timer)
        timer._scheduled = True  # type: ignore[attr-defined]  # asyncio's private flag, as call_at sets it
        return timer

    def call_soon(
        self, callback: Callable[[*_Ts], object], *args: *_Ts, context: Context | None = None
    ) -> asyncio.Handle:
        """asyncio's `call_soon` without its debug-mode checks when debug is off: the same handle, queued in the same
        place. Every task step, wake-up and done callback goes through here (a few hundred per chaos scenario)."""
        this: Any = self  # asyncio's private loop state, typed in no stub
        if not self._fast or this._debug or this._closed:
            return super().call_soon(callback, *args, context=context)
        handle = asyncio.Handle(callback, args, self, context)
        this._ready.append(handle)
        return handle

    def advance(self, seconds: float) -> None:
        self._virtual_now += seconds

    def _run_once(self) -> None:
        """asyncio's loop iteration (a `BaseEventLoop._run_once` of `COPIED_RUN_ONCE`), step for step, virtually.

        The same steps in the same order, so the same callbacks run at the same virtual instants; what it saves is
        the work a simulated loop doesn't need: a selector call and an event list per iteration, a Python-level pop
        per callback (the seeded shuffle is drawn here, one `randrange` per pick exactly as `_ShuffledReady` draws
        it). Asyncio's per-iteration bookkeeping was a sixth of a simulated scenario. Debug mode, and a Python whose
        `_run_once` is not in `COPIED_RUN_ONCE`, take asyncio's own.
        """
        this: Any = self  # asyncio's private loop state, typed in no stub
        events: Any = base_events
        if this._debug or not self._fast:
            super()._run_once()  # type: ignore[misc]  # asyncio's own, private in the stubs
            return
        scheduled: list[Any] = this._scheduled
        count = len(scheduled)
        if (
            count > events._MIN_SCHEDULED_TIMER_HANDLES
            and this._timer_cancelled_count / count > events._MIN_CANCELLED_TIMER_HANDLES_FRACTION
        ):
            kept = []
            for handle in scheduled:
                if handle._cancelled:
                    handle._scheduled = False
                else:
                    kept.append(handle)
            heapq.heapify(kept)
            this._scheduled = scheduled = kept
            this._timer_cancelled_count = 0
        else:
            while scheduled and scheduled[0]._cancelled:
                this._timer_cancelled_count -= 1
                heapq.heappop(scheduled)._scheduled = False
        ready: Any = this._ready
        if not ready and not this._stopping:
            if not scheduled:
                this._selector.select(None)  # raises SimulationDeadlock
            timeout = min(max(0, scheduled[0]._when - self._virtual_now), events.MAXIMUM_SELECT_TIMEOUT)
            if timeout > 0:
                self._virtual_now += timeout
        end_time = self._virtual_now + self._clock_resolution
        while scheduled:
            if scheduled[0]._when >= end_time:
                break
            handle = heapq.heappop(scheduled)
            handle._scheduled = False
            ready.append(handle)
        todo = len(ready)
        if isinstance(ready, _ShuffledReady):
            ready.new_batch()
            # `Random.randrange(left)`, inlined: for an int left > 0 it is `_randbelow(left)`, the fewest getrandbits
            # of bit_length(left) bits below left, so the same stream gives the same picks (two calls fewer each).
            bits = ready._rng.getrandbits
            popleft = collections.deque.popleft
            for left in range(todo, 0, -1):
                index = 0
                if left > 1:
                    width = left.bit_length()
                    index = bits(width)
                    while index >= left:
                        index = bits(width)
                if index == 0:
                    handle = popleft(ready)
                else:
                    handle = ready[index]
                    del ready[index]
                if not handle._cancelled:
                    handle._run()
        else:
            pop = ready.popleft
            for _ in range(todo):
                handle = pop()
                if not handle._cancelled:
                    handle._run()
        handle = None  # breaks a cycle through the frame when a callback raised
