"""Broken rollout engines and trainers, each a bug a fork really ships; the suite must fail each on the right law."""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import replace

from rl.checkpoint.memory_store import MemoryStateStore
from rl.conformance import Implementation
from rl.conformance.ours import fake_version0_adapter
from rl.memory.artifacts import MemoryArtifacts
from rl.sim.grpo_tiers import FakeEngine, FakeTrainer
from rl.types import ArtifactRef, Rollout, RolloutRequest, TrainBatch, TrainResult


class UnseededEngine(FakeEngine):
    """Draws from one process-wide stream instead of the request's seed (it only labels rollouts with it): a retried
    request samples a different group."""

    _draws = itertools.count(1)

    async def generate(self, request: RolloutRequest) -> list[Rollout]:
        group = await super().generate(replace(request, seed=next(self._draws)))
        return [replace(r, seed=request.seed) for r in group]


class StaleAdapterEngine(FakeEngine):
    """Caches the loaded adapter by its policy-version label: a new adapter under a reused label is never loaded."""

    def __init__(self, artifacts: MemoryArtifacts) -> None:
        super().__init__(artifacts)
        self._by_label: dict[int, ArtifactRef] = {}

    async def generate(self, request: RolloutRequest) -> list[Rollout]:
        adapter = self._by_label.setdefault(request.policy_version, request.adapter)
        return await super().generate(replace(request, adapter=adapter))


class FreshOptimizerTrainer(FakeTrainer):
    """Builds a fresh optimizer state for every step instead of continuing from the batch's: momentum is lost."""

    async def train_step(self, batch: TrainBatch) -> TrainResult:
        fresh = (await self.init_adapter(0)).optimizer_state
        return await super().train_step(replace(batch, optimizer_state=fresh))


def _impl(name: str, **tiers: object) -> Implementation:
    return Implementation(name=name, adapter=fake_version0_adapter, **tiers)  # type: ignore[arg-type]


UNSEEDED_ENGINE = _impl("unseeded-engine", engine=UnseededEngine, trainer=FakeTrainer)
STALE_ADAPTER_ENGINE = _impl("stale-adapter-engine", engine=StaleAdapterEngine, trainer=FakeTrainer)
FRESH_OPTIMIZER_TRAINER = _impl("fresh-optimizer-trainer", engine=FakeEngine, trainer=FreshOptimizerTrainer)


class InPlaceStateStore(MemoryStateStore):
    """Writes the checkpoint in place, a chunk per await (an async file write without write-aside-and-rename): a
    driver killed mid-save leaves a truncated checkpoint."""

    async def save(self, data: bytes) -> None:
        self.data = b""
        for start in range(0, len(data), 1024):
            self.data += data[start : start + 1024]
            await asyncio.sleep(0)


IN_PLACE_STATE_STORE = Implementation(name="in-place-state-store", state_store=InPlaceStateStore)
