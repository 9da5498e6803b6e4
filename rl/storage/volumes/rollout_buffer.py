"""The GRPO driver's rollout buffer on local volumes: the `RolloutBuffer` protocol over `VolumeBuffer`."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

from rl.storage.volumes.buffer import VolumeBuffer, rollout_rows
from rl.storage.volumes.store import LocalVolumeStore
from rl.types import Rollout

BUFFER_NAME = "rollouts"


class LocalRolloutBuffer:
    """Each iteration forks the previous buffer version and adds `iter-NNNNN.jsonl` (the training-loop tutorial's
    buffer)."""

    def __init__(self, root: Path, name: str = BUFFER_NAME) -> None:
        self.store = LocalVolumeStore(root)
        self.buffer = VolumeBuffer(self.store, name)

    async def append(
        self, iteration: int, rollouts: Sequence[Rollout], rewards: Sequence[float], parent: str | None
    ) -> str:
        rows = rollout_rows(iteration, rollouts, rewards)
        # In a worker thread: a version is mostly fsyncs, and the driver trains meanwhile (one append at a time).
        return await asyncio.to_thread(self._append, iteration, rows, parent)

    def _append(self, iteration: int, rows: list[dict[str, object]], parent: str | None) -> str:
        base = self.store.open(parent) if parent is not None else None
        return self.buffer.append(iteration, rows, parent=base).version
