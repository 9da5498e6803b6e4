"""One rank of the NCCL checks, started by `torchrun --nproc_per_node=N` (N = 2, or 1 on a one-GPU runner) from
test_ddp_nccl.py (not a test module).

    python -m torch.distributed.run --standalone --nproc_per_node=2 gpu_tests/ddp_nccl_worker.py JOB.pkl OUT_DIR

Each rank binds `cuda:<LOCAL_RANK>`, joins the NCCL process group, runs each job in JOB.pkl, and pickles what it got
(or each job's traceback) to OUT_DIR/rank<RANK>.pkl:

- "grads": for each (name, contributing indices) case, the tutorial's `ddp_shard_step` over this rank's `shard` against
  the single-process full-batch gradient computed on this same GPU: the relative error, the DDP forward and all-reduce
  counts, and a digest of the parameters after one AdamW step (equal on every rank when the gradients agree). The
  cases include an empty shard (one sample: rank 1 gets none) and an empty batch.
- "train": for each named batch, `rl.trainer.ddp.ddp_train_step(..., device=cuda:<LOCAL_RANK>)`'s TrainResult.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pickle
import sys
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from rl.models.opened_model import open_model
from rl.trainer.ddp import ddp_train_step
from rl.trainer.ddp_check import shard_step_report
from rl.types import ArtifactRef, TrainBatch

COLLECTIVE_TIMEOUT_S = 120.0


def grad_cases(rank: int, world_size: int, device: torch.device, job: dict[str, Any]) -> dict[str, Any]:
    batch = TrainBatch(
        step=0,
        rollouts=job["rollouts"],
        rewards=job["rewards"],
        adapter=ArtifactRef(uri="unused://", digest="sha256:" + "0" * 64),
        optimizer_state=None,
        new_version=1,
    )
    return shard_step_report(
        rank, world_size, open_model(Path(job["base_dir"])), job["adapter"], batch, job["config"], job["cases"], device
    )


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
            if name not in jobs:
                continue
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
