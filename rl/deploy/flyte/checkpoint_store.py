"""The driver's checkpoint on Flyte: `FlyteCheckpointStore` over `flyte.ctx().checkpoint`, and
`CrashAfterCheckpoint`, a `CheckpointStore` wrapper that kills the driver once after a chosen iteration (`FaultSpec`).
The format and the other stores are in `rl.storage.checkpoint`."""

from __future__ import annotations

from pathlib import Path

import flyte

from rl.deploy.flyte.bindings import attempt_number
from rl.errors import InjectedDriverFailure
from rl.protocols import CheckpointStore
from rl.storage.checkpoint.format import decode_state


class FlyteCheckpointStore:
    """`CheckpointStore` over `flyte.ctx().checkpoint`: one blob per task, the previous attempt's restored on load.

    On a cluster the checkpoint belongs to the driver task's attempts within one run; a new run starts empty. Outside
    a checkpointing context (`checkpoint` is None) it keeps the blob in memory, so the run simply cannot resume.
    """

    def __init__(self, checkpoint: flyte.Checkpoint | None) -> None:
        self.checkpoint = checkpoint
        self._memory: bytes | None = None

    async def load(self) -> bytes | None:
        if self.checkpoint is None:
            return self._memory
        restored = await self.checkpoint.load()
        if restored is None or not Path(restored).is_file():
            return None
        return Path(restored).read_bytes()

    async def save(self, data: bytes) -> None:
        if self.checkpoint is None:
            self._memory = data
            return
        await self.checkpoint.save(data)


class CrashAfterCheckpoint:
    """A `CheckpointStore` that raises `InjectedDriverFailure` once, right after the checkpoint of `iteration` is
    saved."""

    def __init__(self, inner: CheckpointStore, iteration: int, marker: str = "") -> None:
        self.inner, self.iteration, self.marker = inner, iteration, marker

    async def load(self) -> bytes | None:
        return await self.inner.load()

    async def save(self, data: bytes) -> None:
        await self.inner.save(data)
        if self.iteration < 0 or decode_state(data).iteration != self.iteration or attempt_number() != 0:
            return
        if self.marker:
            marker = Path(self.marker)
            if marker.exists():
                return
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.write_text(f"driver crashed after checkpointing iteration {self.iteration}\n")
        raise InjectedDriverFailure(
            f"injected driver failure after checkpointing iteration {self.iteration}; the next attempt resumes there"
        )
