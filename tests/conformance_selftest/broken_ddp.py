"""Shard-step functions with real multi-rank bugs, bound as `rl.conformance.Implementation`s for the DDP law's selftest.

`REFERENCE` binds the tutorial's `rl.trainer.ddp.ddp_shard_step`. Module-level functions, so spawned gloo ranks can
unpickle them. `BATCH_SCALED_TRAINER` is REAL_CPU with a data-parallel train step whose per-rank scale forgets the world
size.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any
from unittest import mock

from rl.conformance import Implementation
from rl.conformance.bindings.ours import REAL_CPU, LocalDdpTrainer
from rl.conformance.support.tiny_model import tiny_base_model
from rl.trainer.ddp import ddp_shard_step


def skip_backward_on_empty_shard(
    ddp_model: Any, sample_loss_fns: Sequence[Callable[[], Any]], sync_forward: Callable[[], Any]
) -> None:
    """The naive step: accumulate every sample but the last inside `no_sync()`, then synchronise on the last one.

    The last sample's loss rides with the synchronising forward (the sample closures call the wrapped model, so only
    `sync_forward` passes through `DDP.forward`). A rank whose shard is empty has no last sample: it runs no collective
    while its peers wait in the all-reduce, until the collective timeout.
    """
    if not sample_loss_fns:
        return
    with ddp_model.no_sync():
        for fn in sample_loss_fns[:-1]:
            fn().backward()
    (sample_loss_fns[-1]() + sync_forward().float().sum() * 0.0).backward()


def sync_every_sample(
    ddp_model: Any, sample_loss_fns: Sequence[Callable[[], Any]], sync_forward: Callable[[], Any]
) -> None:
    """Synchronise on every sample (no `no_sync()`): as many all-reduces as the rank has samples, at least one."""
    if not sample_loss_fns:
        (sync_forward().float().sum() * 0.0).backward()
        return
    for fn in sample_loss_fns:
        (fn() + sync_forward().float().sum() * 0.0).backward()


SKIPS_EMPTY_SHARD = Implementation(name="skips-empty-shard", ddp_shard_step=skip_backward_on_empty_shard)
SYNCS_EVERY_SAMPLE = Implementation(name="syncs-every-sample", ddp_shard_step=sync_every_sample)
REFERENCE = Implementation(name="reference-ddp", ddp_shard_step=ddp_shard_step)


def _scaled_by_batch_only(rank: int, world_size: int, *args: object) -> object:
    """`ddp_train_step` with each rank's losses scaled by 1 / (samples in the batch), the world size left out: DDP's
    average over ranks then gives the full batch's gradient divided by the world size."""
    import rl.trainer.ddp as ddp

    def forgetting(real: Callable[..., object]) -> Callable[..., object]:
        def fns(*a: object, loss_scale: float, **kw: object) -> object:
            return real(*a, loss_scale=loss_scale / world_size, **kw)

        return fns

    with mock.patch.object(ddp, "batched_loss_fns", forgetting(ddp.batched_loss_fns)):
        return ddp.ddp_train_step(rank, world_size, *args)  # type: ignore[arg-type]


class BatchScaledDdpTrainer(LocalDdpTrainer):
    """Our data-parallel step with the per-rank scale that forgets the world size."""

    async def train_step(self, batch: object) -> object:
        from rl.trainer.config import TrainerConfig
        from rl.trainer.ddp import run_local_ddp

        config = TrainerConfig(lora_rank=4, lora_alpha=8, threads=1)
        root = self.artifacts.root
        return run_local_ddp(self.world_size, _scaled_by_batch_only, tiny_base_model(), root, batch, config)[0]


BATCH_SCALED_TRAINER = replace(REAL_CPU, name="batch-scaled-ddp-trainer", distributed_trainer=BatchScaledDdpTrainer)


def _scaled_by_local_shard(rank: int, world_size: int, *args: object) -> object:
    """`ddp_train_step` with each rank's loss the mean over its own shard (scale 1 / its shard's size) where it should
    be world_size / (samples in the batch): the same on even shards, 1/3 and 1/2 for 2/5 on 5 samples over 2 ranks."""
    import rl.trainer.ddp as ddp

    def local(real: Callable[..., object]) -> Callable[..., object]:
        def fns(*a: object, indices: Sequence[int], loss_scale: float, **kw: object) -> object:
            return real(*a, indices=indices, loss_scale=1.0 / max(1, len(indices)), **kw)

        return fns

    with mock.patch.object(ddp, "batched_loss_fns", local(ddp.batched_loss_fns)):
        return ddp.ddp_train_step(rank, world_size, *args)  # type: ignore[arg-type]


class LocalShardScaledDdpTrainer(LocalDdpTrainer):
    """Our data-parallel step with each rank's scale taken from its own shard's size."""

    async def train_step(self, batch: object) -> object:
        from rl.trainer.config import TrainerConfig
        from rl.trainer.ddp import run_local_ddp

        config = TrainerConfig(lora_rank=4, lora_alpha=8, threads=1)
        root = self.artifacts.root
        return run_local_ddp(self.world_size, _scaled_by_local_shard, tiny_base_model(), root, batch, config)[0]


LOCAL_SHARD_SCALED_TRAINER = replace(
    REAL_CPU, name="local-shard-scaled-ddp-trainer", distributed_trainer=LocalShardScaledDdpTrainer
)
