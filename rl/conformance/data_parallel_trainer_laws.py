"""The data-parallel train step's law, mixed into `TrainerContract`: the public step over several ranks computes what
the single-process step computes on the same batch.

The shard-step law (`DdpShardStepContract`) hands the shard step closures it has already scaled; this one runs the
fork's whole data-parallel step, so a per-rank loss scale that does not make the all-reduced gradient the full batch's
(dividing by the shard's size, or by the batch's without the world size) fails here. Bind `distributed_trainer`,
`(artifacts, world_size) -> Trainer`, a trainer whose `train_step` runs one step on `world_size` ranks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from rl.conformance.support.contract_base import Run, assert_same_step, tier
from rl.protocols import Artifacts, Trainer
from rl.types import Rollout, TrainBatch

__all__ = ["DataParallelTrainerLaws"]

WORLD_SIZE = 2
REL_TOLERANCE = 1e-4
"""How far the 2-rank step's loss and gradient norm may be from the single-process step's, relative. Only the order of
float32 sums differs: each rank sums its shard's per-sample gradients, then gloo's all-reduce adds the ranks' buffers in
an order of its own (its ring or halving-doubling schedule, per bucket), where one process sums the batch in sample
order. Reordering a sum of 5 to 8 float32 terms moves it by a few 2^-24 (~6e-8) relative at most, before cancellation.
1e-4 leaves three orders of magnitude above that, and is far below what a scale by the local shard gives on 5 samples
over 2 ranks (weights 1/3 and 1/2 for 2/5 each: 10.8% off on the gradient norm). Measured equal to the bit."""
UNEVEN_GROUPS = ((0, (1.0, 0.0, 0.25)), (1, (1.0, 0.0)))
"""(group id, rewards of its first samples) of the uneven law's batch: 5 samples, every advantage non-zero, so every
sample contributes and the ranks hold 3 and 2."""


@tier("ddp")
class DataParallelTrainerLaws:
    """Needs `trainer`, `train_batch`, `artifacts`, `distributed_trainer` (through `on_ranks`) and `rl_run`."""

    @pytest.fixture
    def distributed_trainer(self) -> Callable[[Artifacts, int], Trainer]:
        """Return `(artifacts, world_size) -> Trainer`: your trainer running each step on `world_size` data-parallel
        ranks, storing its adapters in `artifacts`. Without it this law skips."""
        pytest.skip("no `distributed_trainer` bound, so the data-parallel train step's law does not apply")

    @pytest.fixture
    def on_ranks(self, distributed_trainer: Callable[[Artifacts, int], Trainer], artifacts: Artifacts) -> Trainer:
        """`distributed_trainer` on `WORLD_SIZE` ranks, storing its adapters in `artifacts`."""
        return distributed_trainer(artifacts, WORLD_SIZE)

    def test_ddp_train_step_equals_the_single_process_step(
        self, trainer: Trainer, on_ranks: Trainer, train_batch: TrainBatch, rl_run: Run[Any]
    ) -> None:
        """One step on 2 ranks reports the loss and the pre-clip gradient norm of the same step in one process: the
        per-rank scale makes the all-reduced gradient the full batch's, as the trainer's aggregation declares."""
        assert_same_step(
            trainer,
            on_ranks,
            train_batch,
            rl_run,
            REL_TOLERANCE,
            lambda what, many, one, ratio: (
                f"the step on {WORLD_SIZE} ranks reported {what} {many!r}, the same step in one process {one!r} "
                f"(ratio {ratio}): the data-parallel step scales each rank's loss so that the all-reduced gradient is "
                f"not the full batch's. Scale each sample's loss by world_size / (samples in the batch), DDP's average "
                f"over ranks then gives the batch's mean"
            ),
        )

    def test_ddp_train_step_on_uneven_shards_equals_the_single_process_step(
        self, trainer: Trainer, on_ranks: Trainer, train_batch: TrainBatch, rl_run: Run[Any]
    ) -> None:
        """5 samples on 2 ranks (shards of 3 and 2): the step reports the single-process step's loss and pre-clip
        gradient norm. Each sample weighs 1 / (samples in the batch) whichever rank holds it; a rank that divides by its
        own shard's size (equal to the right scale on even shards) weighs its samples 1/3 and 1/2, and fails here."""
        group_ids = list(dict.fromkeys(r.group_id for r in train_batch.rollouts))
        rollouts: list[Rollout] = []
        rewards: list[float] = []
        for group, group_rewards in UNEVEN_GROUPS:
            members = [r for r in train_batch.rollouts if r.group_id == group_ids[group]]
            rollouts += members[: len(group_rewards)]
            rewards += group_rewards
        assert len(rollouts) == len(rewards), "the law needs two groups of at least 3 and 2 samples in `train_batch`"
        batch = replace(train_batch, rollouts=rollouts, rewards=rewards)
        assert_same_step(
            trainer,
            on_ranks,
            batch,
            rl_run,
            REL_TOLERANCE,
            lambda what, many, one, ratio: (
                f"on 5 samples over {WORLD_SIZE} ranks (shards of 3 and 2), the step reported {what} {many!r}, the "
                f"same step in one process {one!r} (ratio {ratio}): each rank scales its samples by its own shard's "
                f"size? Scale every sample's loss by world_size / (samples in the whole batch)"
            ),
        )
