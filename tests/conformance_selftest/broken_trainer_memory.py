"""A trainer that keeps something of every step, for the memory law's self-test
(tests/conformance_selftest/test_broken_trainer_memory.py)."""

from __future__ import annotations

import torch

from rl.conformance import Capabilities, Implementation
from rl.conformance.bindings.ours import memory_version0_adapter
from rl.deploy.simulated.artifacts import MemoryArtifacts
from rl.deploy.simulated.grpo_tiers import MemoryEngine, MemoryTrainer
from rl.types import TrainBatch, TrainResult


class LossLogTrainer(MemoryTrainer):
    """Logs each step's loss as a tensor with its autograd graph (a list a logger flushes "later"): 4100 bytes of
    storage kept per step (the graph's 1024 float32 weights and the scalar)."""

    def __init__(self, artifacts: MemoryArtifacts) -> None:
        super().__init__(artifacts)
        self.losses: list[torch.Tensor] = []

    async def train_step(self, batch: TrainBatch) -> TrainResult:
        result = await super().train_step(batch)
        weights = torch.ones(1024, requires_grad=True)
        self.losses.append((weights * result.metrics.loss).sum())  # the graph holds `weights` alive
        return result


LOSS_LOG = Implementation(
    name="loss-log-trainer",
    adapter=memory_version0_adapter,
    engine=MemoryEngine,
    trainer=LossLogTrainer,
    capabilities=Capabilities(trainer_kl_penalty=False),  # the in-memory trainer's step has no KL term, as IN_MEMORY's
)
