"""The real CPU stack learns: on a task whose answer depends on the prompt, GRPO beats the start and any constant, on
several seeds and on each CPU kernel path (a matmul's rounding once decided whether the seed-0 demo learned)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rl.deploy.demo import grpo_demo_config, run_demo
from rl.storage.run_dir import open_run

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "demo_learning.py"
# Seeds 0 and 3 stalled (0.45, 0.58) under lr 1e-2 and groups of 8; seed 5 is the recipe's weakest since.
SEEDS = "0,3,5"
# The benchmark's floor; the recipe's least over 20 seeds and two kernel paths was 0.76 (docs/benchmarks.md).
FLOOR = 0.6


@pytest.mark.slow
def test_grpo_on_the_tiny_model_beats_the_start_and_the_best_constant_answer(tmp_path):
    """Fixed seeds, 120 iterations of 8 prompts x 8 samples: accuracy rises well above the 0.1 constant baseline."""
    with open_run(tmp_path, command="test") as run:
        summary = asyncio.run(run_demo(grpo_demo_config(iterations=120, seed=0), run))
    baseline = summary["constant_baseline_accuracy"]
    assert summary["accuracy_last"] > summary["accuracy_first"] + 0.2
    assert summary["accuracy_last"] > baseline + 0.2
    assert summary["heldout_avg_at_k_last"] > baseline + 0.2


@pytest.mark.slow
@pytest.mark.parametrize("kernel", ["default", "avx2"])
def test_the_demo_learns_on_every_seed_under_each_kernel_path(kernel):
    """The demo's held-out avg@8 stays above its floor on each of three seeds under the kernel path, and their median
    above 0.7: a recipe that learns the task on one machine's rounding only fails here."""
    if kernel == "avx2" and "avx2" not in Path("/proc/cpuinfo").read_text():
        pytest.skip("this CPU has no AVX2: torch cannot take that kernel path here")
    command = [sys.executable, str(SCRIPT), "--seeds", SEEDS, "--kernels", kernel, "--jobs", "1"]
    command += ["--floor", str(FLOOR), "--median-floor", "0.7", "--json"]
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode in (0, 1), done.stderr
    runs = json.loads(done.stdout.splitlines()[-1])["runs"]
    assert sorted(r["seed"] for r in runs) == [0, 3, 5]
    low = [r for r in runs if r["heldout"] < FLOOR]
    assert not low, f"held-out avg@8 below {FLOOR} under ATEN_CPU_CAPABILITY={kernel}: {low}"
    assert done.returncode == 0, done.stdout
