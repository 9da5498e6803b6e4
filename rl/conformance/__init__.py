"""The conformance suite: the laws of every tier protocol and of the GRPO driver, as pytest base classes.

Two ways to run it against your implementation:

- subclass a contract and provide its fixtures (`class TestMyEngine(RolloutEngineContract): ...`), or
- bind an `Implementation` and run the packaged suite:
  `pytest --pyargs rl.conformance.test_suite --rl-impl my_pkg.my_module:IMPL`.

Public API (names are stable): `AdvantageContract`, `LossContract`, `ArtifactsContract`, `StateStoreContract`,
`RolloutEngineContract`, `ScorerContract`, `TrainerContract`, `GrpoDriverContract`, `DriverReplayContract`,
`AgenticContract`, `LoopContract` (all of these), `DdpShardStepContract` (spawns ranks; not in `LoopContract`),
`VolumeStoreContract`, `RolloutBufferContract` (storage, not in `LoopContract`),
`trained_adapter`, `Capabilities`, `AlgorithmSpec` (the algorithm choices an implementation declares),
`sample_loss_as_batch_loss`, `Implementation`, `load_implementation`, `RecordedHistory`, `load_history`,
`record_history`.
Attributes load lazily, so the pytest plugin that imports this package stays cheap.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rl.conformance.advantage_laws import AdvantageContract
    from rl.conformance.agentic import AgenticContract
    from rl.conformance.artifacts import ArtifactsContract
    from rl.conformance.capabilities import Capabilities
    from rl.conformance.ddp import DdpShardStepContract
    from rl.conformance.driver import GrpoDriverContract
    from rl.conformance.history import DriverReplayContract, RecordedHistory, load_history, record_history
    from rl.conformance.implementation import Implementation, load_implementation
    from rl.conformance.loop import LoopContract
    from rl.conformance.loss_laws import LossContract, sample_loss_as_batch_loss
    from rl.conformance.rollout_buffer import RolloutBufferContract
    from rl.conformance.rollout_engine import RolloutEngineContract
    from rl.conformance.scorer import ScorerContract
    from rl.conformance.scoring_utilities import ScoringUtilitiesContract
    from rl.conformance.spec import AlgorithmSpec
    from rl.conformance.state_store import StateStoreContract
    from rl.conformance.trainer import TrainerContract, trained_adapter
    from rl.conformance.volumes import VolumeStoreContract

_EXPORTS = {
    "AdvantageContract": "rl.conformance.advantage_laws",
    "LossContract": "rl.conformance.loss_laws",
    "sample_loss_as_batch_loss": "rl.conformance.loss_laws",
    "AlgorithmSpec": "rl.conformance.spec",
    "AgenticContract": "rl.conformance.agentic",
    "DdpShardStepContract": "rl.conformance.ddp",
    "trained_adapter": "rl.conformance.trainer",
    "Capabilities": "rl.conformance.capabilities",
    "Implementation": "rl.conformance.implementation",
    "load_implementation": "rl.conformance.implementation",
    "ArtifactsContract": "rl.conformance.artifacts",
    "StateStoreContract": "rl.conformance.state_store",
    "RolloutEngineContract": "rl.conformance.rollout_engine",
    "ScorerContract": "rl.conformance.scorer",
    "ScoringUtilitiesContract": "rl.conformance.scoring_utilities",
    "TrainerContract": "rl.conformance.trainer",
    "GrpoDriverContract": "rl.conformance.driver",
    "DriverReplayContract": "rl.conformance.history",
    "RecordedHistory": "rl.conformance.history",
    "load_history": "rl.conformance.history",
    "record_history": "rl.conformance.history",
    "LoopContract": "rl.conformance.loop",
    "VolumeStoreContract": "rl.conformance.volumes",
    "RolloutBufferContract": "rl.conformance.rollout_buffer",
}

__all__ = [
    "AdvantageContract",
    "AgenticContract",
    "AlgorithmSpec",
    "ArtifactsContract",
    "Capabilities",
    "DdpShardStepContract",
    "DriverReplayContract",
    "GrpoDriverContract",
    "Implementation",
    "LoopContract",
    "LossContract",
    "RecordedHistory",
    "RolloutBufferContract",
    "RolloutEngineContract",
    "ScorerContract",
    "ScoringUtilitiesContract",
    "StateStoreContract",
    "TrainerContract",
    "VolumeStoreContract",
    "load_history",
    "load_implementation",
    "record_history",
    "sample_loss_as_batch_loss",
    "trained_adapter",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'rl.conformance' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
