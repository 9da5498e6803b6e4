"""Production's clustered train step on NCCL, on one GPU, through the entry a Flyte pod runs: a one-rank
`torchrun` of `rl.deploy.flyte.clustered.train_step_clustered` under Flyte's task runner (`clustered_step.py`), so the
join (`join_process_group`: `task_device`, `set_device`, NCCL's default group) and the base-model download wait on a
gloo group beside it (`node_base`) run as they do in a pod. gpu_tests/ddp_nccl_worker.py sets NCCL up itself; this does
not. The same scenario runs on gloo on the CPU in tests/test_device_check_clustered.py.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
from clustered_step import one_rank_clustered_step
from gpu_helpers import _missing

pytestmark = [pytest.mark.gpu, pytest.mark.nccl]


def test_the_clustered_entry_trains_one_step_on_nccl_on_one_gpu(
    cuda_device: Any, gpu_model_dir: Path, tmp_path: Path, gpu_report: Any
) -> None:
    """One rank joins a world of 1 on cuda:0 with NCCL, waits for its own download of the base, and publishes an
    adapter equal to the single-GPU `PeftTrainer` step's (rtol 1e-4, atol 1e-6)."""
    if importlib.util.find_spec("flyte") is None:  # the device check carries Flyte's wheels (device_wheels.sh)
        _missing("needs flyte: the clustered entry runs under Flyte's task runner", may_fail=True)
    gpu_report(**one_rank_clustered_step(gpu_model_dir, tmp_path, f"cuda:{cuda_device.index or 0}"))
