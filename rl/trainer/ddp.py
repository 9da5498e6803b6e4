"""The multi-rank GRPO step: the tutorial's `ddp_shard_step` and a train step that runs on every rank of a process
group.

Each rank scales its samples' losses by `W / N` (W ranks, N contributing samples), so DDP's default averaging
all-reduce gives the single-process full-batch gradient up to summation order; DDP's communication hook stays its
own. Every rank runs exactly one synchronising backward whatever its shard holds (possibly nothing), takes the
batch's decisions identically, and agrees on per-rank failures (reading an artifact, an out-of-memory forward, the
optimizer step) before the next collective (`rl.trainer.rank_agreement`), so one rank's error is every rank's
`RankFailedError` instead of a hang. Why: docs/design.md#data-parallel-steps.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import asyncio
import concurrent.futures
import pickle
import socket
import tempfile
import time
from collections.abc import Callable, Coroutine, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel

from rl.errors import RankFailedError
from rl.models.opened_model import open_model
from rl.storage.artifacts import LocalArtifacts
from rl.trainer.adapter import adapter_files
from rl.trainer.batched_loss import batched_loss_fns, empty_stats, stat_sums
from rl.trainer.config import TrainerConfig
from rl.trainer.optimizer_state import optimizer_files
from rl.trainer.rank_agreement import agree, broadcast_outcome, summary
from rl.trainer.step import (
    PreparedStep,
    clip_and_step,
    pinned_threads,
    prepare_step,
    step_metrics,
)
from rl.types import ArtifactRef, StepMetrics, TrainBatch, TrainResult

T = TypeVar("T")

__all__ = ["RankFailedError", "ddp_shard_step", "ddp_train_step", "run_local_ddp", "shard"]


def shard(indices: Sequence[int], rank: int, world_size: int) -> list[int]:
    """Rank `rank`'s share of `indices`: a contiguous slice, sizes differing by at most one, larger slices first.

    Contiguous rather than strided because the batch is in canonical (group, sample) order, so a rank's samples share
    prompts, and because rank r's slice is then the r-th piece of the single-process order. Ranks past the end get [].

    >>> [shard(range(5), r, 2) for r in range(2)]
    [[0, 1, 2], [3, 4]]
    >>> [shard([7], r, 3) for r in range(3)]
    [[7], [], []]
    """
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"need 0 <= rank < world_size with world_size >= 1, got rank={rank}, world_size={world_size}")
    items = list(indices)
    base, extra = divmod(len(items), world_size)
    start = rank * base + min(rank, extra)
    return items[start : start + base + (1 if rank < extra else 0)]


def ddp_shard_step(
    ddp_model: DistributedDataParallel,
    sample_loss_fns: Sequence[Callable[[], torch.Tensor]],
    sync_forward: Callable[[], torch.Tensor],
) -> None:
    """Accumulate per-sample gradients, then synchronise with EXACTLY ONE collective backward (the tutorial's function).

    Backwards inside `no_sync()` accumulate gradients locally with no collective and free each sample's graph at once;
    the first forward-backward after the context all-reduces everything accumulated. Every rank therefore runs one
    forward through `DDP.forward` (`sync_forward`, e.g. a 1-token forward of `ddp_model`) and a zero-scaled backward,
    unconditionally, so the collective count is the same on every rank by construction, empty shards included.

    Between the two, every rank joins one tiny agreement (`rl.trainer.rank_agreement.agree`): if any rank's backwards
    failed, every rank raises `RankFailedError` there. Why not a bare zero backward: docs/design.md#data-parallel-steps.

    Shape: each `sample_loss_fns[i]()` is a 0-d loss; `sync_forward()` is any tensor computed by `ddp_model(...)`.
    """
    error: Exception | None = None
    try:
        with ddp_model.no_sync():
            for fn in sample_loss_fns:
                fn().backward()  # local accumulation; this sample's graph is freed here
    except Exception as exc:
        error = exc
    device = next(ddp_model.parameters()).device  # where the backend reduces (CUDA under NCCL)
    agree(error, device, where="computing its shard's gradients", group=ddp_model.process_group)
    try:
        (sync_forward().float().sum() * 0.0).backward()  # the one synchronising backward
    except Exception as exc:  # no agreement can follow a collective that broke: say so, typed, on every rank it reaches
        group = ddp_model.process_group
        where = "all-reducing the gradients"
        raise RankFailedError(
            dist.get_rank(group), dist.get_world_size(group), where, collective_error=summary(exc)
        ) from exc


def _run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run an artifact-store coroutine to completion from synchronous rank code, even under a running event loop (an
    async task body calling `ddp_train_step`), where `asyncio.run` would refuse."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coro).result()


def ddp_train_step(
    rank: int,
    world_size: int,
    base_dir: Path,
    artifacts_root: Path,
    batch: TrainBatch,
    config: TrainerConfig,
    *,
    device: str | torch.device = "cpu",
) -> TrainResult:
    """One GRPO step on every rank of the initialised default process group; every rank returns the same TrainResult.

    `device` is this rank's compute device: "cpu" under gloo, this rank's `cuda:<local rank>` under NCCL (the caller
    sets `torch.cuda.set_device` to it before `init_process_group`). Each rank loads the adapter and optimizer state
    from the `LocalArtifacts` store at `artifacts_root`, computes its `shard`'s losses with `batched_loss_fns` and
    calls `ddp_shard_step`; every rank then clips and steps identically, and rank 0 stores the new adapter and optimizer
    state and broadcasts the refs. In full: docs/design.md#data-parallel-steps.

    Raises:
        ValueError: no default process group, or `rank`/`world_size` disagree with it.
        BatchError, StaleBatchError: as `PeftTrainer.train_step` (raised on every rank alike).
        RankFailedError: on every rank, when one or more failed (loading, computing gradients, stepping, saving).
    """
    _check_process_group(rank, world_size)
    artifacts = LocalArtifacts(Path(artifacts_root))
    device = torch.device(device)

    with pinned_threads(config.threads), torch.random.fork_rng(devices=[]):
        prepared = _prepare_on_every_rank(rank, artifacts, Path(base_dir), batch, config, device)
        grad_norm, local, error = _step_on_shard(rank, world_size, prepared, batch, config, device)
        # The metrics' all-reduce carries the optimizer step's agreement: no collective of its own.
        sums = agree(error, device, where="taking the optimizer step", values=local)
        metrics: StepMetrics = step_metrics(sums, prepared, grad_norm)
        adapter_ref, opt_ref = _save_on_rank_zero(rank, artifacts, prepared, batch)
        return TrainResult(
            adapter=adapter_ref, optimizer_state=opt_ref, policy_version=batch.new_version, metrics=metrics
        )


def _check_process_group(rank: int, world_size: int) -> None:
    if not dist.is_available() or not dist.is_initialized():
        raise ValueError(
            "ddp_train_step needs an initialised default process group (torch.distributed.init_process_group)"
        )
    if dist.get_rank() != rank or dist.get_world_size() != world_size:
        raise ValueError(
            f"ddp_train_step was told rank {rank} of {world_size} but the process group says rank "
            f"{dist.get_rank()} of {dist.get_world_size()}"
        )


def _prepare_on_every_rank(
    rank: int, artifacts: LocalArtifacts, base_dir: Path, batch: TrainBatch, config: TrainerConfig, device: torch.device
) -> PreparedStep:
    """This rank's model, optimizer and batch signal, once every rank has loaded its own (else each raises)."""
    error: Exception | None = None
    try:
        adapter = _run_sync(artifacts.get(batch.adapter))
        opt_state = _run_sync(artifacts.get(batch.optimizer_state)) if batch.optimizer_state else None
        with open_model(base_dir, tokenizer=False) as base:  # this rank's process opens the base it was sent
            prepared = prepare_step(base, batch, config, adapter, opt_state, device=device)
    except Exception as exc:
        error = exc
    agree(error, device, where="loading the step's inputs")
    return prepared


def _step_on_shard(
    rank: int,
    world_size: int,
    prepared: PreparedStep,
    batch: TrainBatch,
    config: TrainerConfig,
    device: torch.device,
) -> tuple[float, list[float], Exception | None]:
    """Back-propagate this rank's shard through DDP, clip and step (every rank alike, or none when no sample
    contributes); return the pre-clip gradient norm, this rank's statistic sums and its optimizer step's error (agreed
    on by the caller). A failure before the gradient all-reduce is agreed on inside `ddp_shard_step`."""
    stats = empty_stats()
    grad_norm, error = 0.0, None
    n = len(prepared.contributing)
    if n:  # the same on every rank: all ranks step, or none does
        ddp_model = DistributedDataParallel(
            prepared.model,
            # Every rank loaded the same bytes (verified by digest); broadcasting a large frozen base is waste.
            init_sync=False,
        )
        # This rank's shard in micro-batches, as the single-process step runs its batch.
        mine, scale = shard(prepared.contributing, rank, world_size), world_size / n
        try:
            fns = batched_loss_fns(
                prepared.model, batch, prepared.advantages, config, indices=mine, loss_scale=scale, stats_out=stats
            )
        except Exception as exc:  # raised again inside ddp_shard_step, so that its agreement carries it
            fns = [_raiser(exc)]
        # Any in-vocabulary token will do: the forward only has to pass through DDP.forward.
        sync_ids = torch.tensor([batch.rollouts[0].prompt_token_ids[:1]], dtype=torch.long, device=device)  # [1, 1]
        ddp_shard_step(ddp_model, fns, lambda: ddp_model(input_ids=sync_ids).logits)
        try:
            grad_norm = clip_and_step(prepared, config)
        except Exception as exc:
            error = exc
    if error is not None:
        return grad_norm, [0.0, 0.0, 0.0], error
    return grad_norm, stat_sums(stats), None


def _raiser(error: Exception) -> Callable[[], torch.Tensor]:
    def fn() -> torch.Tensor:
        raise error

    return fn


def _save_on_rank_zero(
    rank: int, artifacts: LocalArtifacts, prepared: PreparedStep, batch: TrainBatch
) -> tuple[ArtifactRef, ArtifactRef]:
    """Rank 0 stores the new adapter and optimizer state and broadcasts their refs; every rank returns them (or
    raises `RankFailedError` naming rank 0's error)."""
    error: Exception | None = None
    refs: tuple[ArtifactRef, ArtifactRef] | None = None
    if rank == 0:
        try:
            new_adapter = adapter_files(prepared.model)
            new_opt = optimizer_files(prepared.optimizer, [name for name, _ in prepared.params])
            adapter_ref = _run_sync(artifacts.put(new_adapter, name=f"adapter-v{batch.new_version}"))
            opt_ref = _run_sync(artifacts.put(new_opt, name=f"optimizer-v{batch.new_version}"))
            refs = (adapter_ref, opt_ref)
        except Exception as exc:
            error = exc
    adapter_ref, opt_ref = broadcast_outcome(refs, error, where="saving the step's outputs on rank 0")
    return adapter_ref, opt_ref


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rank_main(
    rank: int,
    world_size: int,
    port: int,
    timeout_s: float,
    out_dir: str,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
) -> None:
    # Two ranks on a shared 2-core machine: one intra-op thread each (steps pin their own count anyway).
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=timeout_s),
    )
    try:
        result = fn(rank, world_size, *args)
    finally:
        dist.destroy_process_group()
    with open(Path(out_dir) / f"rank{rank}.pkl", "wb") as f:
        pickle.dump(result, f)


def run_local_ddp(world_size: int, fn: Callable[..., Any], *args: Any, timeout_s: float = 60.0) -> list[Any]:
    """Run `fn(rank, world_size, *args)` on `world_size` spawned gloo ranks on localhost; return each rank's result.

    For tests and the CPU demo. `fn` and `args` must be picklable (a module-level function). `timeout_s` is the process
    group's collective timeout, so a rank stuck in a collective fails within it instead of hanging; the whole run is
    also abandoned (ranks terminated, TimeoutError) if it takes longer than `timeout_s` plus a start-up allowance.
    An exception in any rank is re-raised here as `torch.multiprocessing.ProcessRaisedException` with its traceback.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    with tempfile.TemporaryDirectory(prefix="rl-ddp-") as out_dir:
        context = mp.start_processes(
            _rank_main,
            args=(world_size, _free_port(), timeout_s, out_dir, fn, args),
            nprocs=world_size,
            join=False,
            start_method="spawn",
        )
        assert context is not None
        # Spawned ranks re-import torch and transformers before the first collective: allow for that on top.
        deadline = time.monotonic() + timeout_s + 60.0
        while not context.join(timeout=0.5):
            if time.monotonic() > deadline:
                for process in context.processes:
                    if process.is_alive():
                        process.terminate()
                for process in context.processes:
                    process.join(5)
                raise TimeoutError(f"{world_size} DDP ranks did not finish within {timeout_s + 60.0:.0f} s")
        results = []
        for rank in range(world_size):
            with open(Path(out_dir) / f"rank{rank}.pkl", "rb") as f:
                results.append(pickle.load(f))
        return results
