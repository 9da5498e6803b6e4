"""A spawned rank of `tests/test_ddp_rank_failures.py` that imports only torch and the agreement (no model stack), so
spawning it costs the torch import alone."""

from __future__ import annotations

import os
import pickle
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist

from rl.trainer.rank_agreement import agree


def dies_before_agreeing(rank: int, world_size: int, port: int, out_dir: str) -> None:
    """Rank 1 exits as a killed rank would, before the agreement; rank 0 records what its agreement raised."""
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size, timeout=timedelta(seconds=120)
    )
    if rank == 1:
        os._exit(3)  # no clean-up, no goodbye: the process is gone
    try:
        agree(None, "cpu", where="computing its shard's gradients")
        outcome = {"outcome": "ok"}
    except Exception as exc:
        outcome = {"outcome": type(exc).__name__, "failed_ranks": getattr(exc, "failed_ranks", None), "text": str(exc)}
    (Path(out_dir) / "rank0.pkl").write_bytes(pickle.dumps(outcome))
