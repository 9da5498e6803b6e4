"""The clustered train step on two GPUs: `rl.trainer.ddp` under `torchrun --nproc_per_node=2` with NCCL.

What the CPU suite proves on gloo (tests/test_ddp.py), proven again on the backend production uses: the tutorial's
`ddp_shard_step` gives the single-process full-batch gradient for even, uneven, empty-shard and empty cases with one DDP
forward and the same number of all-reduces on every rank; `ddp_train_step` on two ranks returns the same TrainResult on
both, equal to the single-GPU `PeftTrainer` step to float32 rounding; a batch without signal changes nothing.

On a one-GPU runner NCCL still gets covered: NCCL refuses two ranks on one device ("Duplicate GPU detected"), so a
one-rank NCCL world runs the same `ddp_train_step` (NCCL init on the bound device, DDP's reducer on NCCL, the object
broadcast of rank 0's refs). Strict mode fails a run in which no NCCL test fits the GPUs
(`rl.gpu.nccl_uncovered_reason`).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from gpu_helpers import base_rollouts, torchrun, varied_rewards
from safetensors.torch import load as load_safetensors

from rl.models.opened_model import open_model
from rl.storage.artifacts import LocalArtifacts
from rl.trainer.config import TrainerConfig
from rl.trainer.peft_trainer import PeftTrainer
from rl.types import TrainBatch, TrainResult

pytestmark = [pytest.mark.gpu, pytest.mark.gpus(2), pytest.mark.nccl]

WORLD = 2
CONFIG = TrainerConfig(lr=1e-3, lora_rank=4, lora_alpha=8, seed=3, threads=1)
# (name, contributing sample indices): 2+2, 2+1 and 1+0 samples per rank, and nothing anywhere.
GRAD_CASES: list[tuple[str, list[int]]] = [
    ("even", [0, 1, 4, 5]),
    ("uneven", [0, 4, 8]),
    ("empty-shard", [6]),
    ("all-empty", []),
]
# float32 on CUDA, summed in another order (per-rank accumulation, then NCCL's ring sum and DDP's mean): the CPU/gloo
# suite measures ~1e-7 and bounds it by 1e-5; cuBLAS may split reductions differently per shape, hence 1e-4 here.
GRAD_RTOL = 1e-4


def test_the_two_rank_nccl_step_equals_the_single_gpu_step(
    gpu_model_dir: Path, tmp_path: Path, gpu_report: Any
) -> None:
    """Gradients: relative error <= 1e-4 for every case on every rank (shards [1, 0] in the empty-shard case), one DDP
    forward per rank, equal all-reduce counts, identical parameters after a step. Train step: 4 groups of 3, one
    silent (9 contributing samples, 5 + 4): both ranks return the same TrainResult; its metrics match the single-GPU
    step (loss abs 1e-6, grad norm rel 1e-4) and its LoRA weights too (rtol 1e-4, atol 1e-6). A batch of silent groups
    takes no step on either rank: adapter and optimizer state come back byte-identical."""
    device = torch.device("cuda", 0)
    artifacts = LocalArtifacts(tmp_path / "store")
    trainer = PeftTrainer(open_model(gpu_model_dir), artifacts, CONFIG, device=device)
    init = asyncio.run(trainer.init_adapter(seed=5))

    grad_rollouts = base_rollouts(gpu_model_dir, groups=3, samples=4, max_tokens=6, seed=21)
    train_rollouts = base_rollouts(gpu_model_dir, groups=4, samples=3, max_tokens=6, seed=31)
    train_rewards = varied_rewards(train_rollouts, silent_groups=[2])
    # Step once first so LoRA's B is non-zero and the compared step moves A as well as B.
    first = TrainBatch(
        step=0,
        rollouts=train_rollouts,
        rewards=train_rewards,
        adapter=init.adapter,
        optimizer_state=init.optimizer_state,
        new_version=1,
    )
    v1 = asyncio.run(trainer.train_step(first))
    signal = TrainBatch(
        step=1,
        rollouts=train_rollouts,
        rewards=train_rewards,
        adapter=v1.adapter,
        optimizer_state=v1.optimizer_state,
        new_version=2,
    )
    batches = {"signal": signal, "silent": replace(signal, rewards=[0.5] * len(train_rollouts))}
    job = {
        "grads": {
            "base_dir": str(gpu_model_dir),
            "config": CONFIG,
            "rollouts": grad_rollouts,
            "rewards": varied_rewards(grad_rollouts),
            "adapter": asyncio.run(artifacts.get(v1.adapter)),
            "cases": GRAD_CASES,
        },
        "train": {
            "base_dir": str(gpu_model_dir),
            "artifacts_root": str(artifacts.root),
            "config": CONFIG,
            "batches": batches,
        },
    }
    start = time.perf_counter()
    per_rank = torchrun(job, tmp_path)
    wall_s = time.perf_counter() - start

    # Gradients, shard by shard.
    reports = [r["grads"] for r in per_rank]
    worst = 0.0
    for name, indices in GRAD_CASES:
        cases = [r[name] for r in reports]
        assert [i for c in cases for i in c["shard"]] == indices, name
        for c in cases:
            worst = max(worst, c["max_rel_err"])
            assert c["max_rel_err"] <= GRAD_RTOL, (name, c)
            assert c["counts"]["forward"] == 1, (name, c)
        if indices:
            assert cases[0]["expected_norm"] > 0, name
        assert len({c["counts"]["allreduce"] for c in cases}) == 1 and cases[0]["counts"]["allreduce"] >= 1, name
        assert len({c["param_digest"] for c in cases}) == 1, name
    assert [len(r["empty-shard"]["shard"]) for r in reports] == [1, 0]

    # The train step against the single-GPU trainer.
    results: list[dict[str, TrainResult]] = [r["train"] for r in per_rank]
    assert results[0] == results[1], "the two ranks returned different TrainResults"
    multi = results[0]["signal"]
    single = asyncio.run(trainer.train_step(batches["signal"]))
    assert multi.policy_version == 2
    assert (multi.metrics.contributing, multi.metrics.skipped_zero_advantage) == (9, 3)
    assert multi.metrics.loss == pytest.approx(single.metrics.loss, rel=1e-5, abs=1e-6)
    assert multi.metrics.grad_norm == pytest.approx(single.metrics.grad_norm, rel=1e-4)
    got = load_safetensors(asyncio.run(artifacts.get(multi.adapter))["adapter_model.safetensors"])
    want = load_safetensors(asyncio.run(artifacts.get(single.adapter))["adapter_model.safetensors"])
    before = load_safetensors(asyncio.run(artifacts.get(v1.adapter))["adapter_model.safetensors"])
    assert got.keys() == want.keys()
    worst_weight = 0.0
    for key in want:
        assert not torch.equal(want[key], before[key]), key
        torch.testing.assert_close(got[key], want[key], rtol=1e-4, atol=1e-6)
        worst_weight = max(worst_weight, float((got[key] - want[key]).abs().max()))

    silent = results[0]["silent"]
    assert silent.metrics.contributing == 0
    assert silent.adapter.digest == v1.adapter.digest
    assert v1.optimizer_state is not None and silent.optimizer_state.digest == v1.optimizer_state.digest

    gpu_report(grad_rel_err=f"{worst:.1e}", weight_abs_diff=f"{worst_weight:.1e}", torchrun_s=round(wall_s, 1))


@pytest.mark.gpus(1)
def test_a_one_rank_nccl_step_equals_the_single_gpu_step(gpu_model_dir: Path, tmp_path: Path, gpu_report: Any) -> None:
    """The NCCL path on one GPU: `ddp_train_step` in a one-rank NCCL world (torchrun --nproc_per_node=1) returns the
    single-GPU step (metrics: loss abs 1e-6, grad norm rel 1e-4; LoRA weights rtol 1e-4, atol 1e-6)."""
    device = torch.device("cuda", 0)
    artifacts = LocalArtifacts(tmp_path / "store")
    trainer = PeftTrainer(open_model(gpu_model_dir), artifacts, CONFIG, device=device)
    init = asyncio.run(trainer.init_adapter(seed=5))
    rollouts = base_rollouts(gpu_model_dir, groups=4, samples=3, max_tokens=6, seed=31)
    rewards = varied_rewards(rollouts, silent_groups=[2])
    batch = TrainBatch(
        step=0, rollouts=rollouts, rewards=rewards, adapter=init.adapter, optimizer_state=init.optimizer_state,
        new_version=1,
    )  # fmt: skip
    job = {
        "train": {
            "base_dir": str(gpu_model_dir),
            "artifacts_root": str(artifacts.root),
            "config": CONFIG,
            "batches": {"signal": batch},
        }
    }
    start = time.perf_counter()
    [rank0] = torchrun(job, tmp_path, world=1)
    wall_s = time.perf_counter() - start
    multi = rank0["train"]["signal"]
    single = asyncio.run(trainer.train_step(batch))
    assert multi.metrics.contributing == single.metrics.contributing == 9
    assert multi.metrics.loss == pytest.approx(single.metrics.loss, rel=1e-5, abs=1e-6)
    assert multi.metrics.grad_norm == pytest.approx(single.metrics.grad_norm, rel=1e-4)
    got = load_safetensors(asyncio.run(artifacts.get(multi.adapter))["adapter_model.safetensors"])
    want = load_safetensors(asyncio.run(artifacts.get(single.adapter))["adapter_model.safetensors"])
    before = load_safetensors(asyncio.run(artifacts.get(init.adapter))["adapter_model.safetensors"])
    for key in want:
        assert not torch.equal(want[key], before[key]) or "lora_A" in key, key
        torch.testing.assert_close(got[key], want[key], rtol=1e-4, atol=1e-6)
    gpu_report(torchrun_s=round(wall_s, 1))
