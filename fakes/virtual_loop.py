"""An asyncio event loop on a virtual clock.

`asyncio.sleep`, `wait_for` timeouts and every timer run on simulated seconds: when no callback is ready the loop jumps
straight to the next timer instead of waiting. A 5-minute trainer cold start therefore costs no wall time, and since the
ready queue is FIFO and timers fire in (time, insertion) order, the same program interleaves the same way on every run.
Threads and real I/O are not simulated: a fake that needs them does not belong on this loop.
"""

from __future__ import annotations

import asyncio
import selectors
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
        return []

    def get_map(self) -> dict[int, selectors.SelectorKey]:  # type: ignore[override]
        return self._keys

    def close(self) -> None:
        self._keys.clear()


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """A selector event loop whose `time()` is a virtual clock starting at 0.0 seconds."""

    def __init__(self) -> None:
        self._virtual_now = 0.0
        selector = _VirtualSelector()
        super().__init__(selector)
        selector.loop = self
        # Timers due within this much of "now" fire together; coarser than float noise from repeated additions.
        self._clock_resolution = 1e-6

    def time(self) -> float:
        return self._virtual_now

    def advance(self, seconds: float) -> None:
        self._virtual_now += seconds
