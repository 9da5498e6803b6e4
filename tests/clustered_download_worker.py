"""One torchrun rank of `tests/test_clustered_download.py` (not a test module): joins the group as a clustered task
does, then fetches the base model through `rl.deploy.flyte.clustered.node_base`, where local rank 0's download (a
stand-in Dir) takes `SLOW_S` seconds while the step's collective timeout is cut to `COLLECTIVE_S`.

Usage: python -m torch.distributed.run --standalone --nproc_per_node=2 clustered_download_worker.py OUT_DIR
"""

from __future__ import annotations

import asyncio
import os
import sys
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist

import rl.deploy.flyte.clustered as clustered

# 5 s, not less: the same timeout bounds joining the group, which is slow on a loaded CI machine (docs/benchmarks.md).
COLLECTIVE_S, SLOW_S, DOWNLOAD_S = 5.0, 15.0, 120.0


class SlowDir:
    """A base-model Dir whose download takes SLOW_S seconds (as 16 GB over a slow link takes many minutes)."""

    path, hash = "s3://bucket/base-model", "sha256:" + "ab" * 32

    async def download(self, local_path: str) -> str:
        await asyncio.sleep(SLOW_S)
        Path(local_path).mkdir(parents=True)
        (Path(local_path) / "config.json").write_text("{}")
        return local_path


def main(out_dir: str) -> int:
    clustered.COLLECTIVE_TIMEOUT = timedelta(seconds=COLLECTIVE_S)
    clustered.DOWNLOAD_TIMEOUT = timedelta(seconds=DOWNLOAD_S)
    rank, _, device, _ = clustered.join_process_group()
    try:
        target = asyncio.run(clustered.node_base(SlowDir(), rank, device))  # type: ignore[arg-type]
        (Path(out_dir) / f"rank{rank}").write_text(str(target))
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.exit(main(sys.argv[1]))
