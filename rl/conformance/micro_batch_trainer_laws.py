"""The gradient-accumulation law, mixed into `TrainerContract`: a step that splits its batch into micro-batches, each
back-propagated on its own and accumulated, computes what the step over the whole batch computes.

Accumulation is where a loss scale goes wrong without any single function being wrong: each micro-batch's loss taken
as its own mean and divided by the number of micro-batches (`loss / gradient_accumulation_steps`) weighs every sample
equally only when the micro-batches are equal, so the law splits the batch unevenly. The advantage and loss laws see
one function on one batch and cannot notice. Bind `micro_batched_trainer`, `(artifacts, micro_batch_size) -> Trainer`,
the trainer under test back-propagating `micro_batch_size` samples at a time. Its marker is `rl_accumulation`, not
`rl_trainer`: a trainer that does not micro-batch (the in-memory one) has nothing here to bind, and its trainer laws
still run whole.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from rl.conformance.support.contract_base import Run, assert_same_step, tier
from rl.protocols import Artifacts, Trainer
from rl.types import TrainBatch

__all__ = ["MicroBatchTrainerLaws"]

MICRO_BATCH_SIZES = (1, 3)
"""One sample at a time, and 3, which splits the laws' batch of 8 into 3 + 3 + 2: uneven, as a batch whose size is
not a multiple of the micro-batch is."""
REL_TOLERANCE = 1e-4
"""Float32 sums in another order (per micro-batch, padded to another width) move the loss and the gradient norm by
~1e-7 relative; a mis-weighted sample moves them by percents."""


@tier("accumulation")
class MicroBatchTrainerLaws:
    """Needs `trainer`, `train_batch`, `artifacts`, `micro_batched_trainer` and `rl_run`."""

    @pytest.fixture
    def micro_batched_trainer(self) -> Callable[[Artifacts, int], Trainer]:
        """Return `(artifacts, micro_batch_size) -> Trainer`: the trainer under test, configured to back-propagate
        `micro_batch_size` samples at a time and accumulate, storing its adapters in `artifacts`. Bind it with dropout
        off, or with dropout masks that do not depend on how the batch is split. Without it this law skips."""
        pytest.skip("no `micro_batched_trainer` bound, so the gradient-accumulation law does not apply")

    @pytest.mark.parametrize("micro_batch_size", MICRO_BATCH_SIZES)
    def test_trainer_step_accumulated_over_micro_batches_equals_the_whole_batch_step(
        self,
        trainer: Trainer,
        micro_batched_trainer: Callable[[Artifacts, int], Trainer],
        artifacts: Artifacts,
        train_batch: TrainBatch,
        micro_batch_size: int,
        rl_run: Run[Any],
    ) -> None:
        """A step accumulated over micro-batches of `micro_batch_size` samples reports the loss and the pre-clip
        gradient norm of the step over the whole batch: every sample weighs the same whatever micro-batch it fell in."""
        assert len(train_batch.rollouts) % MICRO_BATCH_SIZES[-1] != 0, "the law's batch must split unevenly"
        assert_same_step(
            trainer,
            micro_batched_trainer(artifacts, micro_batch_size),
            train_batch,
            rl_run,
            REL_TOLERANCE,
            lambda what, many, one, ratio: (
                f"the step accumulated over micro-batches of {micro_batch_size} (of {len(train_batch.rollouts)} "
                f"samples) reported {what} {many!r}, the step over the whole batch {one!r} (ratio {ratio}): the "
                f"micro-batches' losses are not weighted as the batch's samples are. Scale each micro-batch's summed "
                f"loss by 1 / (samples in the batch), not its own mean by 1 / (number of micro-batches), which is "
                f"right only when the micro-batches are equal"
            ),
        )
