"""One rank of the NCCL checks, started by `torchrun --nproc_per_node=2` from test_ddp_nccl.py (not a test module).

    python -m torch.distributed.run --standalone --nproc_per_node=2 gpu_tests/ddp_nccl_worker.py JOB.pkl OUT_DIR

Each rank binds `cuda:<LOCAL_RANK>`, joins the NCCL process group, runs every job in JOB.pkl, and pickles what it got
(or each job's traceback) to OUT_DIR/rank<RANK>.pkl:

- "grads": for each (name, contributing indices) case, the seed's `ddp_shard_step` over this rank's `shard` against
  the single-process full-batch gradient computed on this same GPU: the relative error, the DDP forward and all-reduce
  counts, and a digest of the parameters after one AdamW step (equal on every rank when the gradients agree). The
  cases include an empty shard (one sample: rank 1 gets none) and an empty batch.
- "train": for each named batch, `rl.trainer.ddp.ddp_train_step(..., device=cuda:<LOCAL_RANK>)`'s TrainResult.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import hashlib
import pickle
import sys
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel

from rl.advantages import group_normalized_advantages
from rl.trainer.ddp import ddp_shard_step, ddp_train_step, shard
from rl.trainer.peft_trainer import load_policy, sample_loss_fns, trainable_parameters
from rl.types import ArtifactRef, TrainBatch

COLLECTIVE_TIMEOUT_S = 120.0


def _perturbed_policy(base_dir: Path, adapter: dict[str, bytes], device: torch.device) -> Any:
    """The adapter with seeded noise on every LoRA weight (drawn on the CPU, so every rank adds the same), so both A and
    B receive non-zero gradients."""
    model = load_policy(base_dir, adapter, trainable=True, device=device)
    model.train()
    generator = torch.Generator().manual_seed(1234)
    with torch.no_grad():
        for _, p in trainable_parameters(model):
            p.add_((0.05 * torch.randn(p.shape, generator=generator)).to(p.device))
    return model


def _grads(model: Any) -> dict[str, torch.Tensor]:
    return {
        n: (p.grad if p.grad is not None else torch.zeros_like(p)).detach().double()
        for n, p in trainable_parameters(model)
    }


def grad_cases(rank: int, world_size: int, device: torch.device, job: dict[str, Any]) -> dict[str, Any]:
    base_dir, config = Path(job["base_dir"]), job["config"]
    rollouts, rewards = job["rollouts"], job["rewards"]
    batch = TrainBatch(
        step=0,
        rollouts=rollouts,
        rewards=rewards,
        adapter=ArtifactRef(uri="unused://", digest="sha256:" + "0" * 64),
        optimizer_state=None,
        new_version=1,
    )
    advantages = group_normalized_advantages([r.group_id for r in rollouts], rewards)
    report: dict[str, Any] = {}
    for name, indices in job["cases"]:
        n = max(len(indices), 1)
        reference = _perturbed_policy(base_dir, job["adapter"], device)
        for fn in sample_loss_fns(
            reference, batch, advantages, config, indices=indices, loss_scale=1.0 / n, stats_out=[]
        ):
            fn().backward()
        expected = _grads(reference)

        model = _perturbed_policy(base_dir, job["adapter"], device)
        ddp_model = DistributedDataParallel(model, init_sync=False)
        counts = {"forward": 0, "allreduce": 0}

        def count_forward(*_: Any, counts: dict[str, int] = counts) -> None:
            counts["forward"] += 1

        # Unannotated on purpose: DDP compares a hook's annotations with real types, and this module's are strings.
        def counting_allreduce(state, bucket, counts=counts):  # type: ignore[no-untyped-def]
            counts["allreduce"] += 1
            return allreduce_hook(state, bucket)

        ddp_model.register_forward_pre_hook(count_forward)
        ddp_model.register_comm_hook(None, counting_allreduce)
        mine = shard(indices, rank, world_size)
        fns = sample_loss_fns(model, batch, advantages, config, indices=mine, loss_scale=world_size / n, stats_out=[])
        sync_ids = torch.tensor([[rollouts[0].prompt_token_ids[0]]], device=device)  # [1, 1]
        ddp_shard_step(
            ddp_model, fns, lambda ddp_model=ddp_model, sync_ids=sync_ids: ddp_model(input_ids=sync_ids).logits
        )
        got = _grads(model)
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


def train_steps(rank: int, world_size: int, device: torch.device, job: dict[str, Any]) -> dict[str, Any]:
    return {
        name: ddp_train_step(
            rank, world_size, Path(job["base_dir"]), Path(job["artifacts_root"]), batch, job["config"], device=device
        )
        for name, batch in job["batches"].items()
    }


def main(job_path: str, out_dir: str) -> int:
    local_rank, rank, world_size = (int(os.environ[k]) for k in ("LOCAL_RANK", "RANK", "WORLD_SIZE"))
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    dist.init_process_group("nccl", timeout=timedelta(seconds=COLLECTIVE_TIMEOUT_S))
    with open(job_path, "rb") as f:
        jobs = pickle.load(f)
    out: dict[str, Any] = {}
    try:
        for name, worker in (("grads", grad_cases), ("train", train_steps)):
            try:
                out[name] = worker(rank, world_size, device, jobs[name])
            except Exception:
                out[name] = RuntimeError(f"rank {rank}, job {name}:\n{traceback.format_exc()}")
                raise
    finally:
        with open(Path(out_dir) / f"rank{rank}.pkl", "wb") as f:
            pickle.dump(out, f)
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
