"""The clustered trainer's base-model download against its collective timeout (`rl.deploy.flyte.clustered.node_base`).

Local rank 0 downloads the base while the other ranks wait for it. They used to wait inside an all-reduce on the
step's process group, whose 10-minute `COLLECTIVE_TIMEOUT` killed the step whenever 16 GB came slower than ~27 MB/s.
Here the download takes 15 s and the step's collective timeout is cut to 5 s: every rank must still get the base.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

WORKER = Path(__file__).resolve().parent / "clustered_download_worker.py"
REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_ranks_wait_for_a_download_longer_than_the_collective_timeout(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    env = {
        **os.environ,
        "RL_NODE_CACHE": str(tmp_path / "cache"),
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    env.pop("NVIDIA_VISIBLE_DEVICES", None)  # a CPU "pod": gloo, as on CI
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(WORKER), str(out)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    targets = {p.name: p.read_text() for p in out.iterdir()}
    assert targets.keys() == {"rank0", "rank1"} and len(set(targets.values())) == 1, targets
    assert (Path(targets["rank0"]) / "config.json").is_file()
