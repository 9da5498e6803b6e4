"""The conformance suite passes on our own implementations.

`TestInMemory` runs every law in memory the way a fork would (by subclassing `LoopContract`); `TestOurBatchLoss` and
`TestTrainerConfigAlgorithms` hold our batch loss and the trainer's advantages to our declaration; `TestLocalArtifacts`
binds one tier.
"""

from __future__ import annotations

import functools

import pytest

from rl.algorithm.advantages import group_normalized_advantages
from rl.algorithm.loss import grpo_sample_loss
from rl.conformance import (
    AdvantageContract,
    ArtifactsContract,
    LoopContract,
    LossContract,
)
from rl.conformance.bindings.ours import IN_MEMORY, REAL_LM, trainer_algorithm
from rl.conformance.bindings.ours import batch_loss as our_batch_loss
from rl.deploy.simulated.artifacts import MemoryArtifacts
from rl.deploy.simulated.grpo_tiers import MemoryEngine, MemoryScorer, MemoryTrainer
from rl.storage.artifacts import LocalArtifacts
from rl.storage.checkpoint.memory_store import MemoryCheckpointStore
from rl.trainer.config import TrainerConfig


class TestInMemory(LoopContract):
    """Every law of every tier in memory, written the way a fork writes its own: fixtures only."""

    @pytest.fixture
    def artifacts(self):
        return MemoryArtifacts()

    @pytest.fixture
    def capabilities(self):
        return IN_MEMORY.capabilities  # MemoryTrainer's step has no KL penalty

    @pytest.fixture
    def state_store(self):
        return MemoryCheckpointStore()

    @pytest.fixture
    def engine(self, artifacts):
        return MemoryEngine(artifacts)

    @pytest.fixture
    def cold_engine(self, artifacts):
        return MemoryEngine(artifacts)

    @pytest.fixture
    def scorer(self):
        return MemoryScorer()

    @pytest.fixture
    def trainer(self, artifacts):
        return MemoryTrainer(artifacts)

    @pytest.fixture
    def another_trainer(self, artifacts):
        return MemoryTrainer(artifacts)

    @pytest.fixture
    def advantages(self):
        return group_normalized_advantages

    @pytest.fixture
    def sample_loss(self):
        return grpo_sample_loss


class TestOurBatchLoss(LossContract):
    """`rl.algorithm.loss.grpo_masked_loss`, the padded `[B, T]` form the trainer runs (as TRL-style trainers do): the
    loss laws under our declaration, through the `batch_loss` fixture."""

    @pytest.fixture
    def batch_loss(self):
        return our_batch_loss


class TestTrainerConfigAlgorithms(AdvantageContract):
    """Our advantages as the trainer calls them under `TrainerConfig(advantage_scale="none")`, checked against the
    declaration `trainer_algorithm` derives from that config (Dr. GRPO: no scale)."""

    @pytest.fixture
    def advantages(self):
        config = TrainerConfig(advantage_scale="none")
        return functools.partial(group_normalized_advantages, scale=config.advantage_scale, eps=config.std_eps)

    @pytest.fixture
    def algorithm(self):
        return trainer_algorithm(TrainerConfig(advantage_scale="none"))


class TestLocalArtifacts(ArtifactsContract):
    """One tier on its own: the filesystem artifact store (no torch needed)."""

    @pytest.fixture
    def artifacts(self, tmp_path):
        return LocalArtifacts(tmp_path / "artifacts")


def test_real_lm_declares_the_algorithm_its_trainer_config_runs():
    """REAL_LM binds its declaration without importing rl.deploy.local (torch): it must stay REAL_MODEL_TRAINER's."""
    from rl.deploy.local import REAL_MODEL_TRAINER

    assert REAL_LM.algorithm == trainer_algorithm(REAL_MODEL_TRAINER)
