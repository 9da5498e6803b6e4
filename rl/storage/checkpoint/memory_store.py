"""A checkpoint store outside the simulator, for driver unit tests.

Fault model: `tear_next_write()` makes the next `save` keep only the first half of its bytes (a non-atomic store that
lost power mid-write); `corrupt(data)` replaces the blob outright (a foreign or damaged checkpoint).
"""

from __future__ import annotations


class MemoryCheckpointStore:
    def __init__(self, data: bytes | None = None) -> None:
        self.data = data
        self.saves = 0
        self._tear = False

    async def load(self) -> bytes | None:
        return self.data

    async def save(self, data: bytes) -> None:
        self.saves += 1
        if self._tear:
            self._tear = False
            self.data = bytes(data[: len(data) // 2])
            return
        self.data = bytes(data)

    def tear_next_write(self) -> None:
        self._tear = True

    def corrupt(self, data: bytes) -> None:
        self.data = data
