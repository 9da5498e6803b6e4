"""The GRPO driver's checkpoint laws: a checkpoint it cannot resume is refused with its `rl.errors` type, before it
trains anything.

The `CheckpointStore` protocol is one blob (`load` / `save`, no key): the store the driver is given is the checkpoint's
whole address, and the blob's encoding is the driver's own. So each law lets the driver write its checkpoint first
(a run whose trainer fails at the last step, so the checkpoint sits before the end of the run), damages what it saved
through the protocol alone (cuts it in half, swaps in foreign bytes or another version's tagging, loses the adapters
it names, resumes under another configuration) and resumes with a recording trainer and store: the driver must raise
the matching error, call no train step and leave the store as it found it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import pytest

from rl.conformance.support.contract_base import Run, tier
from rl.deploy.simulated.artifacts import MemoryArtifacts
from rl.deploy.simulated.grpo_tiers import MemoryEngine, MemoryScorer, MemoryTrainer
from rl.errors import (
    CheckpointConfigMismatchError,
    CheckpointCorruptError,
    CheckpointError,
    CheckpointSchemaError,
    MissingAdapterError,
)
from rl.loop.grpo import GrpoConfig, GrpoDriver, GrpoTiers, run_grpo
from rl.problems import DigitSuccessor
from rl.storage.checkpoint.format import as_altered, as_another_schema_version
from rl.types import ArtifactRef, TrainBatch, TrainResult

__all__ = ["FOREIGN_BLOB", "DriverCheckpointLaws"]

FOREIGN_BLOB = b'{"iteration": 3, "adapter": "not-a-checkpoint", "note": "another program wrote this file"}'
"""Bytes from something else: JSON (the hard case for a JSON checkpoint), but no checkpoint of any driver."""

DAMAGES: dict[str, Callable[[bytes], bytes]] = {
    "truncated": lambda blob: blob[: len(blob) // 2],
    "foreign": lambda blob: FOREIGN_BLOB,
}
"""How a torn or foreign checkpoint is made from the one the driver saved: a save cut midway, another program's file."""


class _TrainerStopped(RuntimeError):
    """The first run's trainer refuses its last step, so the run stops with a checkpoint before the end."""


class _Trainer:
    """The in-memory trainer, recording every step and every adapter it returns; `stop_at` fails that step."""

    def __init__(self, inner: MemoryTrainer, stop_at: int | None = None) -> None:
        self.inner, self.stop_at = inner, stop_at
        self.steps: list[int] = []
        self.adapters: list[ArtifactRef] = []
        self.optimizer_states: list[ArtifactRef] = []

    async def init_adapter(self, seed: int) -> TrainResult:
        result: TrainResult = await self.inner.init_adapter(seed)
        self.adapters.append(result.adapter)
        self.optimizer_states.append(result.optimizer_state)
        return result

    async def train_step(self, batch: TrainBatch) -> TrainResult:
        if batch.step == self.stop_at:
            raise _TrainerStopped(f"the trainer fails step {batch.step} (the law stops the first run here)")
        self.steps.append(batch.step)
        result: TrainResult = await self.inner.train_step(batch)
        self.adapters.append(result.adapter)
        self.optimizer_states.append(result.optimizer_state)
        return result


class _Store:
    """An in-memory checkpoint store that counts saves."""

    def __init__(self, data: bytes | None = None) -> None:
        self.data, self.saves = data, 0

    async def load(self) -> bytes | None:
        return self.data

    async def save(self, data: bytes) -> None:
        self.saves += 1
        self.data = bytes(data)


@dataclass
class _Checkpointed:
    """A run stopped at its last step: its artifacts, its store and every adapter its trainer returned."""

    config: GrpoConfig
    artifacts: MemoryArtifacts
    store: _Store
    adapters: list[ArtifactRef]
    optimizer_states: list[ArtifactRef]


def _tiers(config: GrpoConfig, artifacts: MemoryArtifacts, trainer: _Trainer) -> GrpoTiers:
    return GrpoTiers(
        engine=MemoryEngine(artifacts),
        scorer=MemoryScorer(),
        trainer=trainer,
        artifacts=artifacts,
        prompts=DigitSuccessor(),
    )


@tier("driver")
class DriverCheckpointLaws:
    """A checkpoint the driver cannot resume (torn, foreign, another schema version, another configuration, naming a
    lost adapter) is a typed `rl.errors.CheckpointError` before anything is trained. Mixed into `GrpoDriverContract`."""

    @pytest.fixture
    def checkpoint_from_another_version(self, driver: GrpoDriver) -> Callable[[bytes], bytes]:
        """Return `(blob) -> bytes`: a checkpoint your driver saved, rewritten as another schema version of your driver
        would have saved the same state. Default: ours (`rl.storage.checkpoint.format.as_another_schema_version`) for
        `run_grpo`; for another driver the schema-version law skips until you override this fixture."""
        if driver is run_grpo:
            return as_another_schema_version
        pytest.skip(
            "the driver is not rl.loop.grpo.run_grpo and no `checkpoint_from_another_version` is given, so the law "
            "that another schema version's checkpoint is refused does not apply; provide it to check that law"
        )

    @pytest.fixture
    def checkpoint_altered(self, driver: GrpoDriver) -> Callable[[bytes], bytes]:
        """Return `(blob) -> bytes`: a checkpoint your driver saved with part of its state changed after it was
        written and its integrity check (digest, checksum, signature) left as it was. Default: ours
        (`rl.storage.checkpoint.format.as_altered`) for `run_grpo`; for another driver the law skips until you override
        this fixture (a checkpoint with no integrity check cannot give one)."""
        if driver is run_grpo:
            return as_altered
        pytest.skip(
            "the driver is not rl.loop.grpo.run_grpo and no `checkpoint_altered` is given, so the law that an altered "
            "checkpoint is refused does not apply; provide it to check that law"
        )

    def test_driver_refuses_a_checkpoint_altered_after_it_was_written(
        self,
        driver: GrpoDriver,
        driver_config: GrpoConfig,
        rl_run: Run[Any],
        checkpoint_altered: Callable[[bytes], bytes],
    ) -> None:
        """The state it saved, changed afterwards but still parseable (a partial write, a bad disk, a hand edit),
        raises `CheckpointCorruptError`: the driver checks its checkpoint's integrity before resuming from it."""
        run = self._checkpointed(driver, driver_config, rl_run)
        planted = checkpoint_altered(run.store.data or b"")
        self._refused(driver, run, planted, CheckpointCorruptError, "a checkpoint altered after it was written", rl_run)

    @pytest.mark.parametrize("damage", sorted(DAMAGES))
    def test_driver_refuses_a_torn_or_foreign_checkpoint_before_training(
        self, driver: GrpoDriver, driver_config: GrpoConfig, rl_run: Run[Any], damage: str
    ) -> None:
        """A checkpoint cut in half (a torn write) or another program's file raises `CheckpointCorruptError`; the
        driver neither starts over nor trains."""
        run = self._checkpointed(driver, driver_config, rl_run)
        planted = DAMAGES[damage](run.store.data or b"")
        self._refused(driver, run, planted, CheckpointCorruptError, f"a {damage} checkpoint", rl_run)

    def test_driver_refuses_a_checkpoint_of_another_schema_version_before_training(
        self,
        driver: GrpoDriver,
        driver_config: GrpoConfig,
        rl_run: Run[Any],
        checkpoint_from_another_version: Callable[[bytes], bytes],
    ) -> None:
        """The state it saved, tagged as another schema version wrote it, raises `CheckpointSchemaError`: a release
        never misreads another release's checkpoint."""
        run = self._checkpointed(driver, driver_config, rl_run)
        planted = checkpoint_from_another_version(run.store.data or b"")
        self._refused(driver, run, planted, CheckpointSchemaError, "a checkpoint of another schema version", rl_run)

    def test_driver_refuses_to_resume_another_configurations_checkpoint(
        self, driver: GrpoDriver, driver_config: GrpoConfig, rl_run: Run[Any]
    ) -> None:
        """Resuming a run's checkpoint under another configuration (another seed) raises
        `CheckpointConfigMismatchError`; it never silently continues someone else's run."""
        run = self._checkpointed(driver, driver_config, rl_run)
        other = replace(run.config, seed=run.config.seed + 1)
        what = f"a checkpoint of seed {run.config.seed} resumed with seed {other.seed}"
        self._refused(driver, run, run.store.data, CheckpointConfigMismatchError, what, rl_run, config=other)

    def test_driver_refuses_a_checkpoint_whose_adapter_is_gone(
        self, driver: GrpoDriver, driver_config: GrpoConfig, rl_run: Run[Any]
    ) -> None:
        """When the adapters a checkpoint can name are gone from the artifact store, resuming raises
        `MissingAdapterError` before anything is trained."""
        run = self._checkpointed(driver, driver_config, rl_run)
        for ref in run.adapters:
            run.artifacts.lose(ref)
        what = f"a checkpoint whose adapters ({len(run.adapters)}, every one the first run made) are gone"
        self._refused(driver, run, run.store.data, MissingAdapterError, what, rl_run)

    def test_driver_refuses_a_checkpoint_whose_optimizer_state_is_gone(
        self, driver: GrpoDriver, driver_config: GrpoConfig, rl_run: Run[Any]
    ) -> None:
        """When the optimizer states a checkpoint can name are gone (its adapters still there), resuming raises
        `MissingAdapterError` before anything is trained: each artifact a checkpoint names is verified on its own, so a
        driver that checks only the adapter fails."""
        run = self._checkpointed(driver, driver_config, rl_run)
        for ref in run.optimizer_states:
            run.artifacts.lose(ref)
        what = (
            f"a checkpoint whose optimizer states ({len(run.optimizer_states)}, every one the first run made) are gone "
            "and whose adapters are all there"
        )
        self._refused(driver, run, run.store.data, MissingAdapterError, what, rl_run)

    @staticmethod
    def _checkpointed(driver: GrpoDriver, driver_config: GrpoConfig, rl_run: Run[Any]) -> _Checkpointed:
        """Run sequentially until the trainer fails the last step; the driver has checkpointed by then."""
        config = replace(driver_config, pipelined=False, iterations=max(driver_config.iterations, 2))
        artifacts, store = MemoryArtifacts(), _Store()
        trainer = _Trainer(MemoryTrainer(artifacts, max_staleness=config.max_staleness), stop_at=config.iterations - 1)
        try:
            rl_run(driver(config, _tiers(config, artifacts, trainer), store))
        except Exception as exc:  # the stopped trainer's failure, however the driver wraps it
            stopped: BaseException | None = exc
        else:
            stopped = None
        assert stopped is not None, (
            f"the driver finished although its trainer failed step {config.iterations - 1}: it must fail the run "
            "(and resume it later from its checkpoint), not skip or swallow a failed step"
        )
        assert store.data is not None, (
            f"the driver saved no checkpoint in {config.iterations - 1} trained iterations (then failed with "
            f"{type(stopped).__name__}: {stopped}), so there is nothing to resume from. Save the state after each "
            "iteration"
        )
        return _Checkpointed(config, artifacts, store, trainer.adapters, trainer.optimizer_states)

    @staticmethod
    def _refused(
        driver: GrpoDriver,
        run: _Checkpointed,
        planted: bytes | None,
        expected: type[CheckpointError],
        what: str,
        rl_run: Run[Any],
        *,
        config: GrpoConfig | None = None,
    ) -> None:
        """Resume from `planted`: the driver must raise `expected` having trained nothing and saved nothing."""
        config = config or run.config
        store = _Store(planted)
        trainer = _Trainer(MemoryTrainer(run.artifacts, max_staleness=config.max_staleness))
        outcome: Any = None
        raised: Exception | None = None
        try:
            outcome = rl_run(driver(config, _tiers(config, run.artifacts, trainer), store))
        except Exception as exc:
            raised = exc
        if raised is not None and not isinstance(raised, expected):
            pytest.fail(
                f"{what}: the driver raised {type(raised).__name__}: {raised}; expected rl.errors.{expected.__name__} "
                "(a CheckpointError a caller can catch, whose type says why the checkpoint cannot be resumed)",
                pytrace=False,
            )
        if raised is None:
            version = getattr(outcome, "policy_version", "?")
            pytest.fail(
                f"{what}: the driver did not refuse it: it finished at adapter v{version} having "
                f"trained steps {trainer.steps} (it started over, or continued from what it misread). Raise "
                f"rl.errors.{expected.__name__} before training anything",
                pytrace=False,
            )
        assert not trainer.steps, (
            f"{what}: the driver raised {expected.__name__}, but only after training steps {trainer.steps}; "
            "check the checkpoint before training anything"
        )
        assert store.saves == 0 and store.data == planted, (
            f"{what}: the driver raised {expected.__name__}, but first saved over the checkpoint {store.saves} time(s) "
            "(the evidence of what went wrong is gone); refuse it before saving anything"
        )
