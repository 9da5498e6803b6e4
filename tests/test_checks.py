"""One finite-reward check and one staleness check (`rl.algorithm.checks`): every layer that calls them raises the same
type."""

from __future__ import annotations

import asyncio
import math
import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rl.algorithm.advantages import group_normalized_advantages, no_signal_groups
from rl.algorithm.checks import check_staleness, finite_rewards
from rl.deploy.simulated.artifacts import MemoryArtifacts
from rl.deploy.simulated.grpo_tiers import MemoryEngine, MemoryScorer, MemoryTrainer
from rl.errors import BatchError, NonFiniteRewardError, StaleBatchError, TierError, TrainerError
from rl.loop import grpo
from rl.loop.phase_timing import Scored
from rl.problems import DigitSuccessor
from rl.storage.checkpoint.format import DriverState
from rl.types import Rollout, TrainBatch


def _rollout(gid: int, version: int) -> Rollout:
    return Rollout(gid, "3=", "4", "####4", [3], [4], [-1.0], version, 0)


@given(st.data())
def test_check_staleness_returns_the_staleness_inside_the_bound_and_raises_outside(data):
    trained = data.draw(st.integers(-5, 50), label="trained")
    version = data.draw(st.integers(-5, 50), label="version")
    bound = data.draw(st.integers(0, 10), label="max_staleness")
    if 0 <= trained - version <= bound:
        assert check_staleness(3, version, trained, bound) == trained - version
    else:
        with pytest.raises(StaleBatchError, match=r"^at step 7: rollout 3 ") as caught:
            check_staleness(3, version, trained, bound, "at step 7: ")
        error = caught.value
        assert (error.index, error.rollout_version, error.trained_version, error.staleness) == (
            3,
            version,
            trained,
            trained - version,
        )
        again = pickle.loads(pickle.dumps(error))
        assert type(again) is StaleBatchError and str(again) == str(error)


def test_one_stale_type_satisfies_the_driver_and_the_trainer_callers():
    """The driver's callers catch a `TierError`, a trainer's a `BatchError`/`TrainerError`; both are `ValueError`s."""
    assert issubclass(StaleBatchError, TierError) and issubclass(StaleBatchError, BatchError)
    assert issubclass(StaleBatchError, TrainerError) and issubclass(StaleBatchError, ValueError)
    assert issubclass(NonFiniteRewardError, TierError) and issubclass(NonFiniteRewardError, ValueError)


@given(st.data())
def test_finite_rewards_names_the_first_non_finite_reward(data):
    rewards = data.draw(st.lists(st.floats(allow_nan=True, allow_infinity=True), min_size=1, max_size=8))
    bad = [i for i, r in enumerate(rewards) if not math.isfinite(r)]
    if not bad:
        assert finite_rewards(rewards, lambda i, v: "unused") == rewards
        return
    with pytest.raises(NonFiniteRewardError, match=rf"^reward {bad[0]} is "):
        finite_rewards(rewards, lambda i, v: f"reward {i} is {v}")


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_the_advantages_refuse_a_non_finite_reward_with_the_drivers_error(bad):
    """`rl.algorithm.advantages` (what every trainer computes first) raises the driver's `NonFiniteRewardError`."""
    for fn in (group_normalized_advantages, no_signal_groups):
        with pytest.raises(NonFiniteRewardError, match=r"rewards\[1\] is .* \(group 0\)"):
            fn([0, 0], [1.0, bad])


def _batch(versions: list[int], new_version: int, adapter, optimizer_state) -> TrainBatch:
    rollouts = [_rollout(0, v) for v in versions]
    return TrainBatch(0, rollouts, [float(i) for i in range(len(rollouts))], adapter, optimizer_state, new_version)


def test_the_simulated_trainer_refuses_a_stale_batch_with_the_same_error():
    artifacts = MemoryArtifacts()
    trainer = MemoryTrainer(artifacts, max_staleness=1)
    init = asyncio.run(trainer.init_adapter(0))
    with pytest.raises(StaleBatchError, match=r"step 0: rollout 1 was sampled from policy version 0 .* version 2"):
        asyncio.run(trainer.train_step(_batch([2, 0], 3, init.adapter, init.optimizer_state)))
    with pytest.raises(StaleBatchError, match=r"rollout 0 claims policy version 4, newer"):
        asyncio.run(trainer.train_step(_batch([4], 3, init.adapter, init.optimizer_state)))


def test_the_driver_refuses_rollouts_older_than_max_staleness_naming_the_iteration():
    """The driver's own bookkeeping check: no tier can hand it a stale batch, so its step is called directly."""
    artifacts = MemoryArtifacts()
    trainer = MemoryTrainer(artifacts)
    tiers = grpo.GrpoTiers(MemoryEngine(artifacts), MemoryScorer(), trainer, artifacts, DigitSuccessor())
    init = asyncio.run(trainer.init_adapter(0))
    config = grpo.GrpoConfig(max_staleness=1)
    state = DriverState.initial(config.digest(), init.adapter, init.optimizer_state)
    ahead = DriverState(state.config_digest, 2, init.adapter, 3, init.optimizer_state)
    rollouts = [_rollout(0, 3), _rollout(0, 1)]
    with pytest.raises(StaleBatchError, match=r"^iteration 3: rollout 1 was sampled from policy version 1"):
        asyncio.run(grpo._train(config, tiers, ahead, 3, Scored(rollouts, [0.0, 1.0], {})))
    assert trainer.executions == []  # refused before the trainer saw it
