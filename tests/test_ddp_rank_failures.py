"""A rank that fails mid-step fails every rank with `RankFailedError` naming it, and nothing hangs: the multi-rank
train step on 2 and 3 spawned gloo ranks, with a failure injected on some ranks only (an out-of-memory error in the
forward-backward, an exception in the forward, a failing optimizer step), then a clean step on the same process group
(the agreement left the ranks in step). In-process: the agreement's own rules on a one-rank group, and the error's
message and pickling."""

from __future__ import annotations

import asyncio
import pickle
import shutil
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp
from fixtures_real import one_rank_group, tiny_model_dir
from rank_agreement_worker import dies_before_agreeing
from trainer_batches import make_batch, make_rollouts, varied_rewards

import rl.trainer.ddp as ddp
from rl.errors import RankFailedError, StaleBatchError
from rl.models.opened_model import open_model
from rl.storage.artifacts import LocalArtifacts
from rl.trainer.config import TrainerConfig
from rl.trainer.peft_trainer import PeftTrainer
from rl.trainer.rank_agreement import agree, broadcast_outcome
from rl.types import TrainBatch

__all__ = ["one_rank_group", "tiny_model_dir"]

CONFIG = TrainerConfig(lora_rank=4, lora_alpha=8, seed=3, threads=1)
HANG_GUARD_S = 240.0
"""The gloo collective timeout: it only bounds a hang. A rank left waiting in a collective would end with gloo's
timeout error after it, not `RankFailedError`, so the outcome's type tells an agreed failure from a hang."""
# torch's own message for a CUDA allocation that does not fit (c10/cuda/CUDACachingAllocator.cpp), raised on the CPU.
OOM = (
    "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which 1.06 GiB is free."
)


# ---------------------------------------------------------------------------------------------------------------------
# Workers: module-level so spawned ranks can unpickle them.


def _failing_loss_fns(error: Exception) -> Callable[..., list[Callable[[], torch.Tensor]]]:
    """`batched_loss_fns` whose closures run the real forward, then raise `error` (before their backward)."""
    real = ddp.batched_loss_fns

    def loss_fns(*args: Any, **kwargs: Any) -> list[Callable[[], torch.Tensor]]:
        def fail(fn: Callable[[], torch.Tensor]) -> Callable[[], torch.Tensor]:
            def run() -> torch.Tensor:
                fn()
                raise error

            return run

        return [fail(fn) for fn in real(*args, **kwargs)]

    return loss_fns


def _failing_step(error: Exception) -> Callable[..., float]:
    def clip_and_step(*_: Any) -> float:
        raise error

    return clip_and_step


# scenario -> (attribute of rl.trainer.ddp to replace on the failing ranks, the replacement's factory, its error)
INJECTIONS: dict[str, tuple[str, Callable[[Exception], Any], Exception]] = {
    "oom-in-backward": ("batched_loss_fns", _failing_loss_fns, torch.OutOfMemoryError(OOM)),
    "error-in-forward": ("batched_loss_fns", _failing_loss_fns, ValueError("injected: a bad\nlayer")),
    "optimizer-step": ("clip_and_step", _failing_step, RuntimeError("injected: the optimizer step failed")),
}


def _scenarios(
    rank: int,
    world_size: int,
    base_dir: Path,
    root: Path,
    batch: TrainBatch,
    plan: list[tuple[str, list[int]]],
) -> list[dict[str, Any]]:
    """Each (scenario, failing ranks) of `plan` in turn on the same process group: what this rank's step raised."""
    outcomes = []
    for scenario, failing in plan:
        saved = None
        if scenario in INJECTIONS and rank in failing:
            name, factory, error = INJECTIONS[scenario]
            saved = (name, getattr(ddp, name))
            setattr(ddp, name, factory(error))
        try:
            result = ddp.ddp_train_step(rank, world_size, base_dir, root, batch, CONFIG)
            outcomes.append({"scenario": scenario, "outcome": "ok", "version": result.policy_version})
        except Exception as exc:
            outcomes.append(
                {
                    "scenario": scenario,
                    "outcome": type(exc).__name__,
                    "failed_ranks": getattr(exc, "failed_ranks", None),
                    "message": str(exc),
                    "cause": type(exc.__cause__).__name__ if exc.__cause__ else None,
                }
            )
        finally:
            if saved is not None:
                setattr(ddp, *saved)
    return outcomes


# (world size, [(scenario, failing ranks)]): each ends with a clean step on the same group.
PLANS: dict[int, list[tuple[str, list[int]]]] = {
    2: [("oom-in-backward", [1]), ("optimizer-step", [0]), ("clean", [])],
    3: [("error-in-forward", [2]), ("oom-in-backward", [0, 2]), ("clean", [])],
}


@pytest.fixture(scope="module")
def step_input(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, TrainBatch]:
    root = tmp_path_factory.mktemp("rank-failures-store")
    init = asyncio.run(PeftTrainer(open_model(tiny_model_dir), LocalArtifacts(root), CONFIG).init_adapter(seed=5))
    rollouts = make_rollouts(tiny_model_dir, groups=3, samples=3, seed=41)  # 9 samples: every rank has a shard
    return root, make_batch(rollouts, varied_rewards(rollouts), init.adapter, init.optimizer_state)


@pytest.mark.slow
@pytest.mark.parametrize("world_size", sorted(PLANS))
def test_a_rank_failing_mid_step_fails_every_rank_with_its_name_and_error(
    world_size: int, tiny_model_dir: Path, step_input: tuple[Path, TrainBatch], tmp_path: Path
) -> None:
    """Every rank raises RankFailedError naming exactly the failed ranks and their errors (the failed ranks with their
    own error as its cause), every process exits, and the next step on the same group succeeds on every rank."""
    store, batch = step_input
    root = Path(shutil.copytree(store, tmp_path / "store"))  # each world size saves its own adapter-v1
    plan = PLANS[world_size]
    per_rank = ddp.run_local_ddp(world_size, _scenarios, tiny_model_dir, root, batch, plan, timeout_s=HANG_GUARD_S)
    for rank, outcomes in enumerate(per_rank):
        assert [o["scenario"] for o in outcomes] == [scenario for scenario, _ in plan]
        for (scenario, failing), got in zip(plan, outcomes, strict=True):
            if not failing:
                assert got == {"scenario": scenario, "outcome": "ok", "version": batch.new_version}, (rank, got)
                continue
            assert got["outcome"] == "RankFailedError", (rank, got)
            assert list(got["failed_ranks"]) == failing, (rank, got)
            _, _, error = INJECTIONS[scenario]
            assert f"{type(error).__name__}: {str(error).splitlines()[0]}" in got["message"], (rank, got)
            assert "\n" not in got["message"], (rank, got)  # one line, the injected newline escaped
            assert got["cause"] == (type(error).__name__ if rank in failing else None), (rank, got)
        assert "micro_batch_size" in outcomes[plan.index(next(p for p in plan if p[0] == "oom-in-backward"))]["message"]


@pytest.mark.slow
def test_a_rank_that_dies_fails_its_peer_in_the_agreement_instead_of_hanging(tmp_path: Path) -> None:
    """On gloo the dead peer's closed connection ends the agreement at once: RankFailedError, naming no rank (none
    reported), saying the collective failed. A hang would end with gloo's timeout error after 120 s instead."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    context = mp.start_processes(
        dies_before_agreeing, args=(2, port, str(tmp_path)), nprocs=2, join=False, start_method="spawn"
    )
    for process in context.processes:
        process.join(HANG_GUARD_S)
        assert not process.is_alive(), "a rank hung"
    outcome = pickle.loads((tmp_path / "rank0.pkl").read_bytes())
    assert outcome["outcome"] == "RankFailedError" and outcome["failed_ranks"] == (), outcome
    assert "its collective failed" in outcome["text"] and "timed out" not in outcome["text"].lower(), outcome


# ---------------------------------------------------------------------------------------------------------------------
# In-process: the agreement's rules on a one-rank gloo group.


def test_the_agreement_sums_the_values_when_no_rank_failed(one_rank_group: None) -> None:
    assert agree(None, "cpu", where="testing", values=[1.5, 2.0]) == [1.5, 2.0]
    assert broadcast_outcome(("a", "b"), None, where="testing") == ("a", "b")


def test_a_failure_shared_by_every_rank_alike_keeps_its_own_type(one_rank_group: None) -> None:
    """A stale batch is refused by every rank alike: the input's own typed error, not a rank's."""
    stale = StaleBatchError(0, 5, 3, 1)
    with pytest.raises(StaleBatchError) as raised:
        agree(stale, "cpu", where="loading")
    assert raised.value is stale


def test_any_other_failure_becomes_a_rank_failure_naming_the_rank_and_its_error(one_rank_group: None) -> None:
    oom = torch.OutOfMemoryError(OOM)
    with pytest.raises(RankFailedError) as raised:
        agree(oom, "cpu", where="computing its shard's gradients")
    assert raised.value.failed_ranks == (0,) and raised.value.__cause__ is oom
    assert f"OutOfMemoryError: {OOM}" in str(raised.value) and "micro_batch_size" in str(raised.value)
    with pytest.raises(RankFailedError, match=r"rank 0 \(OSError: disk full\)") as raised:
        broadcast_outcome(None, OSError("disk full"), where="saving")


def test_the_rank_failure_pickles_with_its_fields() -> None:
    """It crosses process boundaries (spawned ranks, remote tasks) with the same message and fields."""
    error = RankFailedError(1, 3, "taking the optimizer step", ((2, "RuntimeError: boom"),))
    again = pickle.loads(pickle.dumps(error))
    assert (str(again), again.failed_ranks, again.rank) == (str(error), (2,), 1)
    lost = RankFailedError(0, 2, "saving", collective_error="RuntimeError: Connection closed by peer")
    assert "Connection closed by peer" in str(pickle.loads(pickle.dumps(lost))) and lost.failed_ranks == ()
