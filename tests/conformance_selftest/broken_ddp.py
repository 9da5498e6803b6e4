"""Shard-step functions with real multi-rank bugs, bound as `rl.conformance.Implementation`s for the DDP law's selftest.

`REFERENCE` binds the tutorial's `rl.trainer.ddp.ddp_shard_step`. Module-level functions, so spawned gloo ranks can
unpickle them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from rl.conformance import Implementation
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
