"""What the conformance self-tests share: running one coroutine to its end, and a train batch from the fakes."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any

from rl.deploy.simulated.artifacts import MemoryArtifacts
from rl.deploy.simulated.grpo_tiers import MemoryEngine, MemoryTrainer
from rl.types import Prompt, RolloutRequest, TrainBatch


def run(awaitable: Awaitable[Any]) -> Any:
    async def wait() -> Any:
        return await awaitable

    return asyncio.run(wait())


def train_batch(artifacts: MemoryArtifacts, trainer: MemoryTrainer) -> TrainBatch:
    init = run(trainer.init_adapter(5))
    engine = MemoryEngine(artifacts)
    rollouts = run(engine.generate(RolloutRequest(0, Prompt("3=", "4"), 4, init.adapter, 0, 9)))
    return TrainBatch(0, rollouts, [1.0, 0.0, 0.5, 0.0], init.adapter, init.optimizer_state, new_version=1)
