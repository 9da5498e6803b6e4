"""The conformance suite: the laws of every tier protocol and of the GRPO driver, as pytest base classes.

Two ways to run it against your implementation (docs/conformance.md):

- subclass a contract and provide its fixtures (`class TestMyEngine(RolloutEngineContract): ...`), or
- bind an `Implementation` and run the packaged suite:
  `pytest --pyargs rl.conformance.test_suite --rl-impl my_pkg.my_module:IMPL`.

Public API (names are stable): the contracts of each tier and of the drivers (`LoopContract` gathers the loop's; the
multi-rank `DdpShardStepContract` and the storage contracts stand apart), `Implementation` and the helpers to bind and
record one. `_HOMES` lists them (`__all__` is its keys) with the module each loads from, on first use, so the pytest
plugin that imports this package stays cheap; the `TYPE_CHECKING` imports name the same (a test holds the two in step).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # `X as X`: an explicit re-export, for strict type checkers
    from rl.conformance.advantage_contract import AdvantageContract as AdvantageContract
    from rl.conformance.agentic_contract import AgenticContract as AgenticContract
    from rl.conformance.algorithm_spec import AlgorithmSpec as AlgorithmSpec
    from rl.conformance.artifacts_contract import ArtifactsContract as ArtifactsContract
    from rl.conformance.capabilities import Capabilities as Capabilities
    from rl.conformance.ddp_shard_step_contract import DdpShardStepContract as DdpShardStepContract
    from rl.conformance.driver_replay_contract import DriverReplayContract as DriverReplayContract
    from rl.conformance.generation_batch_contract import GenerationBatchContract as GenerationBatchContract
    from rl.conformance.grpo_driver_contract import GrpoDriverContract as GrpoDriverContract
    from rl.conformance.implementation import Implementation as Implementation
    from rl.conformance.implementation import load_implementation as load_implementation
    from rl.conformance.law_sizes import LawSizes as LawSizes
    from rl.conformance.loop_contract import LoopContract as LoopContract
    from rl.conformance.loss_contract import LossContract as LossContract
    from rl.conformance.loss_contract import sample_loss_as_batch_loss as sample_loss_as_batch_loss
    from rl.conformance.recorded_history import RecordedHistory as RecordedHistory
    from rl.conformance.recorded_history import load_history as load_history
    from rl.conformance.recorded_history import record_history as record_history
    from rl.conformance.rollout_buffer_contract import RolloutBufferContract as RolloutBufferContract
    from rl.conformance.rollout_engine_contract import RolloutEngineContract as RolloutEngineContract
    from rl.conformance.scorer_contract import ScorerContract as ScorerContract
    from rl.conformance.scoring_utilities_contract import ScoringUtilitiesContract as ScoringUtilitiesContract
    from rl.conformance.state_store_contract import StateStoreContract as StateStoreContract
    from rl.conformance.trainer_contract import TrainerContract as TrainerContract
    from rl.conformance.trainer_contract import trained_adapter as trained_adapter
    from rl.conformance.volume_store_contract import VolumeStoreContract as VolumeStoreContract


# The module under rl.conformance that each public name loads from.
_HOMES = {
    "AdvantageContract": "advantage_contract",
    "AgenticContract": "agentic_contract",
    "AlgorithmSpec": "algorithm_spec",
    "ArtifactsContract": "artifacts_contract",
    "Capabilities": "capabilities",
    "DdpShardStepContract": "ddp_shard_step_contract",
    "DriverReplayContract": "driver_replay_contract",
    "GenerationBatchContract": "generation_batch_contract",
    "GrpoDriverContract": "grpo_driver_contract",
    "Implementation": "implementation",
    "LawSizes": "law_sizes",
    "LoopContract": "loop_contract",
    "LossContract": "loss_contract",
    "RecordedHistory": "recorded_history",
    "RolloutBufferContract": "rollout_buffer_contract",
    "RolloutEngineContract": "rollout_engine_contract",
    "ScorerContract": "scorer_contract",
    "ScoringUtilitiesContract": "scoring_utilities_contract",
    "StateStoreContract": "state_store_contract",
    "TrainerContract": "trainer_contract",
    "VolumeStoreContract": "volume_store_contract",
    "load_history": "recorded_history",
    "load_implementation": "implementation",
    "record_history": "recorded_history",
    "sample_loss_as_batch_loss": "loss_contract",
    "trained_adapter": "trainer_contract",
}
__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    module = _HOMES.get(name)
    if module is None:
        raise AttributeError(f"module 'rl.conformance' has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
