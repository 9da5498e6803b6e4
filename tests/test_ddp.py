"""The DDP shard step and the multi-rank train step on 2 spawned gloo ranks: DDP's gradient is the single-process
full-batch gradient for even, uneven and empty shards, every rank runs the same number of collective backwards, ranks
end with identical parameters, and the multi-rank step equals `PeftTrainer`'s."""

from __future__ import annotations

import asyncio
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from fixtures_real import tiny_model_dir
from hypothesis import given
from hypothesis import strategies as st
from safetensors.torch import load as load_safetensors
from trainer_batches import make_batch, make_rollouts, varied_rewards

from rl.models.opened_model import open_model
from rl.storage.artifacts import LocalArtifacts
from rl.trainer.config import TrainerConfig
from rl.trainer.ddp import ddp_train_step, run_local_ddp, shard
from rl.trainer.ddp_check import shard_step_report
from rl.trainer.peft_trainer import (
    PeftTrainer,
)
from rl.types import Rollout, TrainBatch, TrainResult

__all__ = ["tiny_model_dir"]

CONFIG = TrainerConfig(lora_rank=4, lora_alpha=8, seed=3, threads=1)
TIMEOUT_S = 300.0
"""The gloo collective timeout. No test here expects a deadlock, so it only bounds a hang: generous enough that a rank
slowed by a saturated machine never trips it (a step takes about a second), and a hang still fails, as a timeout error
where RankFailedError or the rank's own error is expected."""
WORLD = 2


@given(st.lists(st.integers(), max_size=30), st.integers(min_value=1, max_value=6))
def test_shards_partition_the_indices_in_order_with_sizes_within_one(indices: list[int], world_size: int) -> None:
    """Concatenating the ranks' shards gives back the indices; shard sizes differ by at most one, larger first."""
    shards = [shard(indices, r, world_size) for r in range(world_size)]
    assert [i for s in shards for i in s] == indices
    sizes = [len(s) for s in shards]
    assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)


def test_shard_rejects_a_rank_outside_the_world() -> None:
    with pytest.raises(ValueError, match="rank=2, world_size=2"):
        shard([1, 2], 2, 2)


# ---------------------------------------------------------------------------------------------------------------------
# Workers: module-level so spawned ranks can unpickle them.

# (name, contributing sample indices): 2+2, 2+1 and 1+0 samples per rank, and nothing anywhere.
GRAD_CASES: list[tuple[str, list[int]]] = [
    ("even", [0, 1, 4, 5]),
    ("uneven", [0, 4, 8]),
    ("empty-shard", [6]),
    ("all-empty", []),
]


def _grad_worker(
    rank: int, world_size: int, base_dir: Path, rollouts: list[Rollout], rewards: list[float], adapter: dict[str, bytes]
) -> dict[str, Any]:
    batch = make_batch(rollouts, rewards, _dummy_ref(), None)
    return shard_step_report(
        rank, world_size, open_model(base_dir, tokenizer=False), adapter, batch, CONFIG, GRAD_CASES, torch.device("cpu")
    )


def _dummy_ref() -> Any:
    from rl.types import ArtifactRef

    return ArtifactRef(uri="unused://", digest="sha256:" + "0" * 64)


def _failing_steps(
    rank: int, world_size: int, base_dir: Path, artifacts_root: Path, stale: Any, good: Any
) -> list[str]:
    """Two steps that must fail without a hang: a stale batch (every rank), then a store only rank 1 cannot read."""
    outcomes = []
    for batch, root in ((stale, artifacts_root), (good, artifacts_root if rank == 0 else artifacts_root / "missing")):
        try:
            ddp_train_step(rank, world_size, base_dir, root, batch, CONFIG)
            outcomes.append("ok")
        except Exception as exc:
            # A rank left waiting in a collective would end with gloo's timeout error here, not RankFailedError: the
            # outcome's type tells a hang from an agreed failure, however long either took.
            outcomes.append(type(exc).__name__)
    return outcomes


def _all_rank_checks(rank: int, world_size: int, jobs: dict[str, tuple[Any, ...]]) -> dict[str, Any]:
    """Every multi-rank check in one spawn (spawning costs seconds of imports per rank): each job's result, or the
    error it raised, so each test reports its own failure."""
    workers = {"grads": _grad_worker, "train": ddp_train_step, "failures": _failing_steps}
    out: dict[str, Any] = {}
    for name, args in jobs.items():
        try:
            out[name] = workers[name](rank, world_size, *args)
        except Exception:
            out[name] = RuntimeError(f"rank {rank}, job {name}:\n{traceback.format_exc()}")
    return out


@dataclass
class DdpRun:
    """The inputs the parent prepared and what each rank returned, per job."""

    base_dir: Path
    artifacts: LocalArtifacts
    train_batch: TrainBatch
    v1: TrainResult
    per_rank: list[dict[str, Any]]

    def results(self, job: str) -> list[Any]:
        for rank_out in self.per_rank:
            if isinstance(rank_out[job], Exception):
                raise rank_out[job]
        return [rank_out[job] for rank_out in self.per_rank]


@pytest.fixture(scope="module")
def ddp_run(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> DdpRun:
    store_root = tmp_path_factory.mktemp("ddp-store")
    artifacts = LocalArtifacts(store_root)
    trainer = PeftTrainer(open_model(tiny_model_dir), artifacts, CONFIG)
    init = asyncio.run(trainer.init_adapter(seed=5))

    grad_rollouts = make_rollouts(tiny_model_dir, groups=3, samples=4, seed=21)
    adapter = asyncio.run(artifacts.get(init.adapter))

    # 4 groups of 3, one silent: 9 contributing samples, sharded 5 + 4.
    train_rollouts = make_rollouts(tiny_model_dir, groups=4, samples=3, seed=31)
    train_rewards = varied_rewards(train_rollouts, silent_groups=[2])
    # Step once first so the LoRA B matrices are non-zero and the compared step moves A as well as B.
    v1 = asyncio.run(trainer.train_step(make_batch(train_rollouts, train_rewards, init.adapter, init.optimizer_state)))
    train_batch = make_batch(train_rollouts, train_rewards, v1.adapter, v1.optimizer_state, step=1, new_version=2)

    stale = make_batch(train_rollouts, train_rewards, init.adapter, init.optimizer_state, new_version=3)
    good = make_batch(train_rollouts, train_rewards, init.adapter, init.optimizer_state)

    jobs = {
        "grads": (tiny_model_dir, grad_rollouts, varied_rewards(grad_rollouts), adapter),
        "train": (tiny_model_dir, store_root, train_batch, CONFIG),
        "failures": (tiny_model_dir, store_root, stale, good),
    }
    per_rank = run_local_ddp(WORLD, _all_rank_checks, jobs, timeout_s=TIMEOUT_S)
    return DdpRun(tiny_model_dir, artifacts, train_batch, v1, per_rank)


@pytest.mark.slow
def test_ddp_gradient_equals_the_single_process_full_batch_gradient(ddp_run: DdpRun) -> None:
    """For even, uneven, empty and all-empty shards: relative error <= 1e-5 on every rank, one DDP forward and the
    same number of all-reduces on every rank, and identical parameters after an optimizer step."""
    reports = ddp_run.results("grads")
    for name, indices in GRAD_CASES:
        per_rank = [r[name] for r in reports]
        assert [i for r in per_rank for i in r["shard"]] == indices, name
        for r in per_rank:
            assert r["max_rel_err"] <= 1e-5, (name, r)
            assert r["counts"]["forward"] == 1, (name, r)
        if indices:
            assert per_rank[0]["expected_norm"] > 0, name
        assert len({r["counts"]["allreduce"] for r in per_rank}) == 1 and per_rank[0]["counts"]["allreduce"] >= 1, name
        assert len({r["param_digest"] for r in per_rank}) == 1, name
    assert [len(r["empty-shard"]["shard"]) for r in reports] == [1, 0]


@pytest.mark.slow
def test_the_multi_rank_train_step_equals_the_single_process_step(ddp_run: DdpRun) -> None:
    """Two ranks, 9 contributing samples (5 + 4) and one no-signal group: both ranks return the same TrainResult, and
    its adapter matches the single-process step's to float32 rounding."""
    results: list[TrainResult] = ddp_run.results("train")
    artifacts = ddp_run.artifacts
    single = asyncio.run(PeftTrainer(open_model(ddp_run.base_dir), artifacts, CONFIG).train_step(ddp_run.train_batch))

    assert results[0] == results[1]
    multi = results[0]
    assert multi.policy_version == 2
    assert (multi.metrics.contributing, multi.metrics.skipped_zero_advantage) == (9, 3)
    assert multi.metrics.loss == pytest.approx(single.metrics.loss, rel=1e-5, abs=1e-7)
    assert multi.metrics.grad_norm == pytest.approx(single.metrics.grad_norm, rel=1e-5)
    got = load_safetensors(asyncio.run(artifacts.get(multi.adapter))["adapter_model.safetensors"])
    want = load_safetensors(asyncio.run(artifacts.get(single.adapter))["adapter_model.safetensors"])
    before = load_safetensors(asyncio.run(artifacts.get(ddp_run.v1.adapter))["adapter_model.safetensors"])
    assert got.keys() == want.keys()
    for key in want:
        assert not torch.equal(want[key], before[key]), key
        torch.testing.assert_close(got[key], want[key], rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_failures_surface_on_every_rank_instead_of_hanging(ddp_run: DdpRun) -> None:
    """A stale batch raises StaleBatchError on every rank; one rank's unreadable input fails every rank with
    RankFailedError (a rank that hung in a collective would end with gloo's timeout error)."""
    outcomes = ddp_run.results("failures")
    assert outcomes == [["StaleBatchError", "RankFailedError"], ["StaleBatchError", "RankFailedError"]]
