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
    from rl.conformance.advantage_laws import AdvantageContract as AdvantageContract
    from rl.conformance.agentic import AgenticContract as AgenticContract
    from rl.conformance.artifacts import ArtifactsContract as ArtifactsContract
    from rl.conformance.capabilities import Capabilities as Capabilities
    from rl.conformance.ddp import DdpShardStepContract as DdpShardStepContract
    from rl.conformance.driver import GrpoDriverContract as GrpoDriverContract
    from rl.conformance.generation_batch import GenerationBatchContract as GenerationBatchContract
    from rl.conformance.history import DriverReplayContract as DriverReplayContract
    from rl.conformance.history import RecordedHistory as RecordedHistory
    from rl.conformance.history import load_history as load_history
    from rl.conformance.history import record_history as record_history
    from rl.conformance.implementation import Implementation as Implementation
    from rl.conformance.implementation import load_implementation as load_implementation
    from rl.conformance.loop import LoopContract as LoopContract
    from rl.conformance.loss_laws import LossContract as LossContract
    from rl.conformance.loss_laws import sample_loss_as_batch_loss as sample_loss_as_batch_loss
    from rl.conformance.rollout_buffer import RolloutBufferContract as RolloutBufferContract
    from rl.conformance.rollout_engine import RolloutEngineContract as RolloutEngineContract
    from rl.conformance.scorer import ScorerContract as ScorerContract
    from rl.conformance.scoring_utilities import ScoringUtilitiesContract as ScoringUtilitiesContract
    from rl.conformance.sizes import LawSizes as LawSizes
    from rl.conformance.spec import AlgorithmSpec as AlgorithmSpec
    from rl.conformance.state_store import StateStoreContract as StateStoreContract
    from rl.conformance.trainer import TrainerContract as TrainerContract
    from rl.conformance.trainer import trained_adapter as trained_adapter
    from rl.conformance.volumes import VolumeStoreContract as VolumeStoreContract


# The module under rl.conformance that each public name loads from.
_HOMES = {
    "AdvantageContract": "advantage_laws",
    "AgenticContract": "agentic",
    "AlgorithmSpec": "spec",
    "ArtifactsContract": "artifacts",
    "Capabilities": "capabilities",
    "DdpShardStepContract": "ddp",
    "DriverReplayContract": "history",
    "GenerationBatchContract": "generation_batch",
    "GrpoDriverContract": "driver",
    "Implementation": "implementation",
    "LawSizes": "sizes",
    "LoopContract": "loop",
    "LossContract": "loss_laws",
    "RecordedHistory": "history",
    "RolloutBufferContract": "rollout_buffer",
    "RolloutEngineContract": "rollout_engine",
    "ScorerContract": "scorer",
    "ScoringUtilitiesContract": "scoring_utilities",
    "StateStoreContract": "state_store",
    "TrainerContract": "trainer",
    "VolumeStoreContract": "volumes",
    "load_history": "history",
    "load_implementation": "implementation",
    "record_history": "history",
    "sample_loss_as_batch_loss": "loss_laws",
    "trained_adapter": "trainer",
}
__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    module = _HOMES.get(name)
    if module is None:
        raise AttributeError(f"module 'rl.conformance' has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
