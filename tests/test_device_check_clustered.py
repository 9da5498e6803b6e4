"""The device check's clustered step (gpu_tests/clustered_step.py) on the CPU: the same one-rank torchrun of
production's `train_step_clustered` through Flyte's task runner that gpu_tests/test_clustered_nccl.py runs on NCCL,
here on gloo (a CPU rank's `task_device`), so the launcher, the worker and the checks are exercised wherever CI runs.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rl.gpu import VLLM_MODEL
from rl.models import build_tiny_model

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow  # a torchrun agent and a worker that imports torch, transformers and Flyte: seconds


def test_the_clustered_entry_trains_one_step_on_gloo_on_the_cpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(REPO / "gpu_tests"))
    monkeypatch.delenv("NVIDIA_VISIBLE_DEVICES", raising=False)  # a CPU rank: task_device gives "cpu", gloo
    from clustered_step import one_rank_clustered_step

    base = build_tiny_model(tmp_path / "base-model", VLLM_MODEL)
    numbers = one_rank_clustered_step(base, tmp_path / "step", "cpu")
    assert numbers["backend"] == "gloo"
