"""The data-parallel train step's law, mixed into `TrainerContract`: the public step over several ranks computes what
the single-process step computes on the same batch.

The shard-step law (`DdpShardStepContract`) hands the shard step closures it has already scaled; this one runs the
fork's whole data-parallel step, so a per-rank loss scale that does not make the all-reduced gradient the full batch's
(dividing by the shard's size, or by the batch's without the world size) fails here. Bind `distributed_trainer`,
`(artifacts, world_size) -> Trainer`, a trainer whose `train_step` runs one step on `world_size` ranks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from rl.conformance._base import Run, assert_same_step, tier
from rl.protocols import Artifacts, Trainer
from rl.types import TrainBatch

__all__ = ["DataParallelTrainerLaws"]

WORLD_SIZE = 2
REL_TOLERANCE = 1e-4
"""Float32 sums in another order (per rank, then all-reduced) move the loss and the gradient norm by ~1e-7 relative."""


@tier("ddp")
class DataParallelTrainerLaws:
    """Needs `trainer`, `train_batch`, `artifacts`, `distributed_trainer` and `rl_run`."""

    @pytest.fixture
    def distributed_trainer(self) -> Callable[[Artifacts, int], Trainer]:
        """Return `(artifacts, world_size) -> Trainer`: your trainer running each step on `world_size` data-parallel
        ranks, storing its adapters in `artifacts`. Without it this law skips."""
        pytest.skip("no `distributed_trainer` bound, so the data-parallel train step's law does not apply")

    def test_ddp_train_step_equals_the_single_process_step(
        self,
        trainer: Trainer,
        distributed_trainer: Callable[[Artifacts, int], Trainer],
        artifacts: Artifacts,
        train_batch: TrainBatch,
        rl_run: Run[Any],
    ) -> None:
        """One step on 2 ranks reports the loss and the pre-clip gradient norm of the same step in one process: the
        per-rank scale makes the all-reduced gradient the full batch's, as the trainer's aggregation declares."""
        single = rl_run(trainer.train_step(train_batch)).metrics
        multi = rl_run(distributed_trainer(artifacts, WORLD_SIZE).train_step(train_batch)).metrics
        assert_same_step(
            single,
            multi,
            REL_TOLERANCE,
            lambda what, many, one, ratio: (
                f"the step on {WORLD_SIZE} ranks reported {what} {many!r}, the same step in one process {one!r} "
                f"(ratio {ratio}): the data-parallel step scales each rank's loss so that the all-reduced gradient is "
                f"not the full batch's. Scale each sample's loss by world_size / (samples in the batch), DDP's average "
                f"over ranks then gives the batch's mean"
            ),
        )
