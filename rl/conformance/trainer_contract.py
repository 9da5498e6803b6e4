"""The laws of `rl.protocols.Trainer`: a seeded init and a step that is a pure function of its batch; and
`trained_adapter`, the second adapter the engine laws need."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import pytest

from rl.conformance.algorithm_spec import AlgorithmSpec
from rl.conformance.behaviour_policy_laws import BehaviourPolicyLaws
from rl.conformance.capabilities import Capabilities, require
from rl.conformance.data_parallel_trainer_laws import DataParallelTrainerLaws
from rl.conformance.kl_reference_laws import KlReferenceLaws
from rl.conformance.micro_batch_trainer_laws import MicroBatchTrainerLaws
from rl.conformance.support.contract_base import ContractBase, Run, must_provide, tier
from rl.conformance.support.step_reference import DIGIT_PROMPTS, StepLawInputs, sample_groups
from rl.conformance.trainer_memory_laws import TrainerMemoryLaws
from rl.conformance.trainer_padding_laws import TrainerPaddingLaws
from rl.conformance.trainer_restore_laws import TrainerRestoreLaws
from rl.conformance.truncation_laws import TruncationLaws
from rl.deploy.simulated.artifacts import MemoryArtifacts
from rl.protocols import Artifacts, RolloutEngine, Trainer
from rl.seeding import derive_seed
from rl.types import ArtifactRef, Rollout, TrainBatch, TrainResult

__all__ = ["TrainerContract", "digit_groups", "trained_adapter"]


_REWARD_PATTERN = (1.0, 0.0, 0.5, 0.0)


def _rewards_with_signal(rollouts: Sequence[Rollout]) -> list[float]:
    """Rewards that differ within every group of two or more, so every group carries a training signal."""
    seen: dict[int, int] = {}
    rewards = []
    for r in rollouts:
        position = seen.get(r.group_id, 0)
        seen[r.group_id] = position + 1
        rewards.append(_REWARD_PATTERN[position % len(_REWARD_PATTERN)])
    return rewards


def _digests(result: TrainResult) -> Mapping[str, str]:
    return {"adapter": result.adapter.digest, "optimizer state": result.optimizer_state.digest}


def digit_groups(
    engine: RolloutEngine, adapter: ArtifactRef, policy_version: int, seed: int, run: Run[Any]
) -> list[Rollout]:
    """Two groups of four rollouts of the digit task (prompts "3=" and "7="), sampled by `engine` from `adapter`."""
    return sample_groups(
        engine, adapter, DIGIT_PROMPTS, seed, run, stream="conformance.rollouts", policy_version=policy_version
    )


def trained_adapter(engine: RolloutEngine, trainer: Trainer, seed: int, run: Run[Any], steps: int = 3) -> ArtifactRef:
    """The adapter after `steps` training steps on groups `engine` samples (digit-task prompts, rewards with signal in
    every group): a second adapter for the engine laws, one that samples differently from version 0."""
    state = run(trainer.init_adapter(derive_seed("conformance.other-adapter", seed)))
    for step in range(steps):
        rollouts = digit_groups(engine, state.adapter, step, derive_seed("conformance.other-adapter", seed, step), run)
        batch = TrainBatch(
            step=step,
            rollouts=rollouts,
            rewards=_rewards_with_signal(rollouts),
            adapter=state.adapter,
            optimizer_state=state.optimizer_state,
            new_version=step + 1,
        )
        state = run(trainer.train_step(batch))
    return state.adapter


@tier("trainer")
class TrainerContract(
    TrainerRestoreLaws,
    DataParallelTrainerLaws,
    MicroBatchTrainerLaws,
    TrainerPaddingLaws,
    TruncationLaws,
    KlReferenceLaws,
    BehaviourPolicyLaws,
    TrainerMemoryLaws,
    ContractBase,
):
    """Laws of `rl.protocols.Trainer`: a seeded init and a step that is a pure function of its batch.

    Provide `trainer`, `another_trainer` (a new instance of it) and an `engine` that samples from its adapters (it
    builds the training batch), or override `training_rollouts` to build the batch's rollouts yourself. `artifacts`
    defaults to an in-memory store. `rl.conformance.trainer_restore_laws` holds the restore and staleness laws,
    `data_parallel_trainer_laws` and `micro_batch_trainer_laws` the data-parallel and gradient-accumulation laws.
    """

    @pytest.fixture
    def artifacts(self) -> Artifacts:
        """The artifact store `trainer` and `engine` share; defaults to an in-memory store (override to use yours)."""
        return MemoryArtifacts()

    @pytest.fixture
    def trainer(self) -> Trainer:
        """Return the `rl.protocols.Trainer` under test, storing its adapters in the `artifacts` fixture's store."""
        raise must_provide(
            "TrainerContract", "trainer", "the Trainer under test, storing adapters in the `artifacts` fixture's store"
        )

    @pytest.fixture
    def algorithm(self) -> AlgorithmSpec:
        """Return the `rl.conformance.AlgorithmSpec` the trainer's step computes; the default is ours."""
        return AlgorithmSpec()

    @pytest.fixture
    def another_trainer(self) -> Trainer:
        """Return a second, new instance of the trainer under test on the same `artifacts` store, one that has trained
        nothing (what a resumed or retried step runs in)."""
        raise must_provide(
            "TrainerContract",
            "another_trainer",
            "a second, new Trainer instance on the `artifacts` fixture's store that has trained nothing",
        )

    @pytest.fixture
    def engine(self) -> RolloutEngine:
        """Return a `RolloutEngine` that samples from the trainer's adapters (it builds the training batch), or override
        `training_rollouts` instead."""
        raise must_provide(
            "TrainerContract",
            "engine",
            "a RolloutEngine that samples from the trainer's adapters in the `artifacts` store "
            "(or override `training_rollouts`)",
        )

    @pytest.fixture
    def trainer_version0(self, trainer: Trainer, rl_seed: int, rl_run: Run[Any]) -> TrainResult:
        """The trainer's version-0 adapter and optimizer state: `init_adapter` of a seed derived from `rl_seed`."""
        return rl_run(trainer.init_adapter(derive_seed("conformance.trainer.init", rl_seed)))

    @pytest.fixture
    def step_law_inputs(
        self,
        trainer: Trainer,
        engine: RolloutEngine,
        trainer_version0: TrainResult,
        algorithm: AlgorithmSpec,
        rl_seed: int,
        rl_run: Run[Any],
    ) -> StepLawInputs:
        """The fixtures a law on a batch the engine samples takes together (`StepLawInputs`)."""
        return StepLawInputs(trainer, engine, trainer_version0, algorithm, rl_seed, rl_run)

    @pytest.fixture
    def training_rollouts(
        self, engine: RolloutEngine, trainer_version0: TrainResult, rl_seed: int, rl_run: Run[Any]
    ) -> list[Rollout]:
        """Two groups of four rollouts sampled by `engine` from the version-0 adapter (prompts "3=" and "7=")."""
        return digit_groups(
            engine, trainer_version0.adapter, 0, derive_seed("conformance.trainer.rollouts", rl_seed), rl_run
        )

    @pytest.fixture
    def train_batch(self, trainer_version0: TrainResult, training_rollouts: list[Rollout]) -> TrainBatch:
        """Step 0 from version 0 to version 1, with rewards that differ within every group (every group has signal)."""
        return TrainBatch(
            step=0,
            rollouts=list(training_rollouts),
            rewards=_rewards_with_signal(training_rollouts),
            adapter=trainer_version0.adapter,
            optimizer_state=trainer_version0.optimizer_state,
            new_version=1,
        )

    def test_trainer_init_adapter_is_deterministic_in_its_seed(
        self, trainer: Trainer, rl_seed: int, rl_run: Run[Any]
    ) -> None:
        """`init_adapter(seed)` twice gives the same version-0 artifacts; another seed gives another adapter."""
        seed = derive_seed("conformance.trainer.init", rl_seed)
        a, b = rl_run(trainer.init_adapter(seed)), rl_run(trainer.init_adapter(seed))
        assert a.policy_version == 0, f"init_adapter returned version {a.policy_version}, expected 0"
        assert _digests(a) == _digests(b), f"init_adapter({seed}) twice gave {_digests(a)} and {_digests(b)}"
        c = rl_run(trainer.init_adapter(derive_seed("conformance.trainer.init.other", rl_seed)))
        assert c.adapter.digest != a.adapter.digest, "init_adapter gave the same adapter for two different seeds"

    def test_trainer_train_step_returns_version_new_version(
        self, trainer: Trainer, train_batch: TrainBatch, rl_run: Run[Any]
    ) -> None:
        """`train_step(batch)` returns an adapter labelled `batch.new_version`."""
        result = rl_run(trainer.train_step(train_batch))
        assert result.policy_version == train_batch.new_version, (
            f"train_step returned policy_version {result.policy_version} for a batch with new_version "
            f"{train_batch.new_version}"
        )

    def test_trainer_replaying_a_batch_is_bitwise_identical(
        self, trainer: Trainer, train_batch: TrainBatch, capabilities: Capabilities, rl_run: Run[Any]
    ) -> None:
        """Training the same batch twice gives bitwise-identical adapter and optimizer-state digests."""
        require(capabilities, "bitwise_replay", "replaying a batch is bitwise identical")
        first = rl_run(trainer.train_step(train_batch))
        again = rl_run(trainer.train_step(train_batch))
        assert _digests(first) == _digests(again), (
            f"the same batch trained twice gave {_digests(first)} and then {_digests(again)}"
        )

    def test_trainer_step_uses_the_optimizer_state_it_is_given(
        self, trainer: Trainer, train_batch: TrainBatch, rl_run: Run[Any]
    ) -> None:
        """The optimizer state travels with the batch: the second step from version 1 with version 1's optimizer state
        differs from the same step restarted from version 0's (fresh) optimizer state. A trainer that builds a fresh
        optimizer every step, or keeps it in its process, loses the moments on every task retry or move."""
        v1 = rl_run(trainer.train_step(train_batch))
        assert v1.optimizer_state is not None, "train_step returned no optimizer state; the next step needs it"
        second = replace(train_batch, step=1, adapter=v1.adapter, optimizer_state=v1.optimizer_state, new_version=2)
        carried = rl_run(trainer.train_step(second))
        restarted = rl_run(trainer.train_step(replace(second, optimizer_state=train_batch.optimizer_state)))
        assert carried.adapter.digest != restarted.adapter.digest, (
            "step 1 gave the same adapter with version 1's optimizer state as with version 0's: the trainer ignores "
            "the batch's optimizer_state (a fresh optimizer every step, or one kept in the process)"
        )

    def test_trainer_step_changes_the_adapter(
        self, trainer: Trainer, train_batch: TrainBatch, rl_run: Run[Any]
    ) -> None:
        """A step on a batch with signal in every group returns an adapter different from the one it trained."""
        result = rl_run(trainer.train_step(train_batch))
        assert result.adapter.digest != train_batch.adapter.digest, "a step with signal left the adapter unchanged"
