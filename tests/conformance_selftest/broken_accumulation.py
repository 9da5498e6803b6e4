"""A trainer with the classic gradient-accumulation bug, bound as an `rl.conformance.Implementation` for the
gradient-accumulation law's selftest: REAL_CPU whose micro-batched step divides each micro-batch's own mean by the
number of micro-batches (`loss / gradient_accumulation_steps`), which weighs every sample alike only when the
micro-batches are equal."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any
from unittest import mock

from rl.conformance.bindings.ours import REAL_CPU, micro_batched_trainer
from rl.protocols import Artifacts


def _mean_per_micro_batch(
    model: Any, batch: Any, advantages: Sequence[float], config: Any, *, indices: Sequence[int], loss_scale: float
) -> list[float]:
    from rl.trainer.batched_loss import batched_loss_fns, empty_stats, stat_sums

    size = config.micro_batch_size
    chunks = [list(indices[start : start + size]) for start in range(0, len(indices), size)]
    stats = empty_stats()
    for chunk in chunks:
        # Its own mean, then 1 / (number of micro-batches): the chunk's samples weigh 1 / (len(chunk) * len(chunks)).
        scale = 1.0 / (len(chunk) * len(chunks))
        for fn in batched_loss_fns(model, batch, advantages, config, indices=chunk, loss_scale=scale, stats_out=stats):
            fn().backward()
    return stat_sums(stats)


class MeanPerMicroBatchTrainer:
    """`micro_batched_trainer` whose accumulation weighs each micro-batch's mean equally."""

    def __init__(self, artifacts: Artifacts, micro_batch_size: int) -> None:
        self.inner = micro_batched_trainer(artifacts, micro_batch_size)

    async def init_adapter(self, seed: int) -> Any:
        return await self.inner.init_adapter(seed)

    async def train_step(self, batch: Any) -> Any:
        import rl.trainer.step as step

        with mock.patch.object(step, "batched_backward", _mean_per_micro_batch):
            return await self.inner.train_step(batch)


MEAN_PER_MICRO_BATCH = replace(REAL_CPU, name="mean-per-micro-batch", micro_batched_trainer=MeanPerMicroBatchTrainer)
