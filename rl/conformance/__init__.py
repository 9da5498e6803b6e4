"""The conformance suite: the laws of every tier protocol and of the GRPO driver, as pytest base classes.

Two ways to run it against your implementation:

- subclass a contract and provide its fixtures (`class TestMyEngine(RolloutEngineContract): ...`), or
- bind an `Implementation` and run the packaged suite:
  `pytest --pyargs rl.conformance.test_suite --rl-impl my_pkg.my_module:IMPL`.

Public API (names are stable): the contracts of each tier and of the drivers (`LoopContract` gathers the loop's; the
multi-rank `DdpShardStepContract` and the storage contracts stand apart), `Implementation` and the helpers to bind and
record one. `__all__` lists them, read from the imports under `TYPE_CHECKING` below: the one place they are written.
Attributes load lazily, so the pytest plugin that imports this package stays cheap.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # `X as X`: an explicit re-export, for strict type checkers
    from rl.conformance.advantage_laws import AdvantageContract as AdvantageContract
    from rl.conformance.agentic import AgenticContract as AgenticContract
    from rl.conformance.artifacts import ArtifactsContract as ArtifactsContract
    from rl.conformance.capabilities import Capabilities as Capabilities
    from rl.conformance.ddp import DdpShardStepContract as DdpShardStepContract
    from rl.conformance.driver import GrpoDriverContract as GrpoDriverContract
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
    from rl.conformance.spec import AlgorithmSpec as AlgorithmSpec
    from rl.conformance.state_store import StateStoreContract as StateStoreContract
    from rl.conformance.trainer import TrainerContract as TrainerContract
    from rl.conformance.trainer import trained_adapter as trained_adapter
    from rl.conformance.volumes import VolumeStoreContract as VolumeStoreContract


def _exports() -> dict[str, str]:
    """Each public name and the module it lives in, read from the `TYPE_CHECKING` imports above (type checkers read the
    same lines), so the names are written once and still load lazily."""
    tree = ast.parse(Path(__file__).read_text(encoding="utf-8"))
    block = next(n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING")
    return {a.name: n.module for n in block.body if isinstance(n, ast.ImportFrom) and n.module for a in n.names}


_EXPORTS = _exports()
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'rl.conformance' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
