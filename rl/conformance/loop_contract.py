"""The aggregate contract: every tier's laws against one implementation of the whole loop."""

from __future__ import annotations

from typing import Any

import pytest

from rl.conformance.advantage_contract import AdvantageContract
from rl.conformance.agentic_contract import AgenticContract
from rl.conformance.artifacts_contract import ArtifactsContract
from rl.conformance.driver_replay_contract import DriverReplayContract
from rl.conformance.grpo_driver_contract import GrpoDriverContract
from rl.conformance.loss_contract import LossContract
from rl.conformance.rollout_engine_contract import RolloutEngineContract
from rl.conformance.scorer_contract import ScorerContract
from rl.conformance.state_store_contract import StateStoreContract
from rl.conformance.support.contract_base import Run
from rl.conformance.trainer_contract import TrainerContract, trained_adapter
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
