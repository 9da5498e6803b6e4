"""The check that `ddp_shard_step` is exact: on each rank, DDP's gradient against the single-process full-batch one.

Run on every rank of an initialised process group (gloo on CPU in `tests/test_ddp.py`, NCCL on GPUs in
`gpu_tests/ddp_nccl_worker.py`); one implementation serves both, so the GPU test checks what the CPU test checks.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel

from rl.algorithm.advantages import group_normalized_advantages
from rl.models.opened_model import ModelDir
from rl.trainer.adapter import load_policy, trainable_parameters
from rl.trainer.batched_loss import batched_loss_fns, empty_stats
from rl.trainer.config import TrainerConfig
from rl.trainer.ddp import ddp_shard_step, shard
from rl.types import TrainBatch

ShardStep = Callable[[DistributedDataParallel, Sequence[Callable[[], torch.Tensor]], Callable[[], torch.Tensor]], None]
"""A shard-step function: `(ddp_model, sample_loss_fns, sync_forward) -> None`, like `rl.trainer.ddp.ddp_shard_step`."""


def perturbed_policy(base_dir: ModelDir, adapter: Mapping[str, bytes], device: torch.device) -> Any:
    """The adapter with seeded noise on every LoRA weight, so both A and B receive non-zero gradients.

    The noise is drawn on the CPU and moved, so every rank and every device adds the same numbers.
    """
    model = load_policy(base_dir, adapter, trainable=True, device=device)
    model.train()
    generator = torch.Generator().manual_seed(1234)
    with torch.no_grad():
        for _, p in trainable_parameters(model):
            p.add_((0.05 * torch.randn(p.shape, generator=generator)).to(p.device))
    return model


def gradients(model: Any) -> dict[str, torch.Tensor]:
    """Each trainable parameter's gradient in float64 (zeros where backward left none)."""
    return {
        n: (p.grad if p.grad is not None else torch.zeros_like(p)).detach().double()
        for n, p in trainable_parameters(model)
    }


def shard_step_report(
    rank: int,
    world_size: int,
    base_dir: ModelDir,
    adapter: Mapping[str, bytes],
    batch: TrainBatch,
    config: TrainerConfig,
    cases: Sequence[tuple[str, Sequence[int]]],
    device: torch.device,
    *,
    step_fn: ShardStep = ddp_shard_step,
) -> dict[str, Any]:
    """For each (name, contributing sample indices) case: the relative gradient error of `step_fn` (by default the
    tutorial's `ddp_shard_step`; the conformance suite passes a fork's) over this rank's `shard` against the full-batch
    gradient, the DDP forward and all-reduce counts, this rank's shard, and a digest of the parameters after one AdamW
    step (equal on every rank when the gradients agree). The loss closures are the trainer's at a micro-batch size of
    1: one per sample, so a shard step that all-reduces per backward runs as many collectives as its shard has
    samples."""
    rollouts = batch.rollouts
    per_sample = replace(config, micro_batch_size=1)
    advantages = group_normalized_advantages([r.group_id for r in rollouts], batch.rewards)
    report: dict[str, Any] = {}
    for name, indices in cases:
        n = max(len(indices), 1)
        reference = perturbed_policy(base_dir, adapter, device)
        for fn in batched_loss_fns(
            reference, batch, advantages, per_sample, indices=indices, loss_scale=1.0 / n, stats_out=empty_stats()
        ):
            fn().backward()
        expected = gradients(reference)

        model = perturbed_policy(base_dir, adapter, device)
        ddp_model = DistributedDataParallel(model, init_sync=False)
        counts = {"forward": 0, "allreduce": 0}

        def count_forward(*_: Any, counts: dict[str, int] = counts) -> None:
            counts["forward"] += 1

        # Unannotated on purpose: DDP compares a hook's annotations with real types, and this module's are strings.
        def counting_allreduce(state, bucket, counts=counts):
            counts["allreduce"] += 1
            return allreduce_hook(state, bucket)

        ddp_model.register_forward_pre_hook(count_forward)
        ddp_model.register_comm_hook(None, counting_allreduce)
        mine = shard(indices, rank, world_size)
        fns = batched_loss_fns(
            model, batch, advantages, per_sample, indices=mine, loss_scale=world_size / n, stats_out=empty_stats()
        )
        sync_ids = torch.tensor([[rollouts[0].prompt_token_ids[0]]], device=device)  # [1, 1]

        def sync_forward(ddp_model: Any = ddp_model, sync_ids: torch.Tensor = sync_ids) -> torch.Tensor:
            return ddp_model(input_ids=sync_ids).logits

        step_fn(ddp_model, fns, sync_forward)
        got = gradients(model)
        rel = max(
            (
                float((got[k] - expected[k]).norm() / expected[k].norm())
                if expected[k].norm() > 0
                else float(got[k].norm())
            )
            for k in expected
        )
        optimizer = torch.optim.AdamW([p for _, p in trainable_parameters(model)], lr=1e-2, foreach=False)
        optimizer.step()
        digest = hashlib.sha256(b"".join(p.detach().cpu().numpy().tobytes() for _, p in trainable_parameters(model)))
        report[name] = {
            "shard": mine,
            "max_rel_err": rel,
            "expected_norm": float(sum(float(g.norm()) for g in expected.values())),
            "counts": dict(counts),
            "param_digest": digest.hexdigest(),
        }
        dist.barrier()
    return report
