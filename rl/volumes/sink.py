"""The GRPO driver's rollout buffer on local volumes: the `RolloutSink` protocol over `RolloutBuffer`."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from rl.types import Rollout
from rl.volumes.buffer import RolloutBuffer, rollout_rows
from rl.volumes.local import LocalVolumeStore

BUFFER_NAME = "rollouts"


class VolumeRolloutSink:
    """Each iteration forks the previous buffer version and adds `iter-NNNNN.jsonl` (seed 000's buffer)."""

    def __init__(self, root: Path, name: str = BUFFER_NAME) -> None:
        self.store = LocalVolumeStore(root)
        self.buffer = RolloutBuffer(self.store, name)

    async def append(
        self, iteration: int, rollouts: Sequence[Rollout], rewards: Sequence[float], parent: str | None
    ) -> str:
        base = self.store.open(parent) if parent is not None else None
        return self.buffer.append(iteration, rollout_rows(iteration, rollouts, rewards), parent=base).version
