"""The aggregate contract: every tier's laws against one implementation of the whole loop."""

from __future__ import annotations

from typing import Any

import pytest

from rl.conformance._base import Run
from rl.conformance.advantage_laws import AdvantageContract
from rl.conformance.agentic import AgenticContract
from rl.conformance.artifacts import ArtifactsContract
from rl.conformance.driver import GrpoDriverContract
from rl.conformance.history import DriverReplayContract
from rl.conformance.loss_laws import LossContract
from rl.conformance.rollout_engine import RolloutEngineContract
from rl.conformance.scorer import ScorerContract
from rl.conformance.state_store import StateStoreContract
from rl.conformance.trainer import TrainerContract, trained_adapter
from rl.protocols import RolloutEngine, Trainer
from rl.types import ArtifactRef

__all__ = ["LoopContract"]


class LoopContract(
    AdvantageContract,
    LossContract,
    ArtifactsContract,
    StateStoreContract,
    RolloutEngineContract,
    ScorerContract,
    TrainerContract,
    GrpoDriverContract,
    DriverReplayContract,
    AgenticContract,
):
    """Every law of every tier. Provide `artifacts`, `state_store`, `engine`, `cold_engine` (a new instance of the
    engine), `scorer`, `trainer` and `another_trainer` (a new instance; the engines and the trainers should request
    `artifacts` so they share one store); `driver`
    defaults to `rl.loop.grpo.run_grpo`, and the engine's `adapter` to the trainer's version-0 adapter."""

    @pytest.fixture
    def adapter(self, trainer: Trainer, rl_run: Run[Any]) -> ArtifactRef:
        """The engine laws' adapter: `trainer.init_adapter(0)`'s version-0 adapter."""
        return rl_run(trainer.init_adapter(0)).adapter

    @pytest.fixture
    def other_adapter(self, engine: RolloutEngine, trainer: Trainer, rl_seed: int, rl_run: Run[Any]) -> ArtifactRef:
        """The engine laws' second adapter: the trainer's adapter three steps on (`trained_adapter`)."""
        return trained_adapter(engine, trainer, rl_seed, rl_run)
