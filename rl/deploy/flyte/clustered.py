"""The multi-node GRPO trainer on a `ClusteredTaskEnvironment`, and the pipelined driver that calls it (the
training-loop tutorial).

`train_step_clustered` has `train_step`'s call shape, so the driver is the same `run_grpo` with another train task.
Every rank joins the process group torchrun set up, copies the adapter and optimizer state into a rank-local store and
calls `rl.trainer.ddp.ddp_train_step`; rank 0 saves, uploads and broadcasts the outputs, so every rank returns the same.
A clustered task has no controller: it must not call another task (`tests/test_flyte_clustered.py` checks). Outside
torchrun it forms a one-rank gloo group of its own. Local rank 0 downloads the base model once per pod, not once per
rank. How and why: docs/flyte.md#the-clustered-trainer.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

from flyte.io import Dir

from rl.deploy.flyte.bindings import DirArtifacts, local_base, quiet_transformers, ref_of, upload_dir
from rl.deploy.flyte.config import GrpoRunConfig
from rl.deploy.flyte.envs import CLUSTER_TIMEOUT, cluster_train_env, grpo_clustered_driver_env
from rl.deploy.flyte.grpo_driver import GrpoRunResult, run_driver
from rl.deploy.flyte.grpo_tasks import TrainInput, TrainOutput
from rl.gpu import task_device
from rl.identity import content_digest
from rl.types import ArtifactRef

__all__ = [
    "cluster_train_env",
    "grpo_clustered_driver_env",
    "node_base",
    "node_cache",
    "train_rl_clustered",
    "train_step_clustered",
]

NODE_CACHE_ENV = "RL_NODE_CACHE"
COLLECTIVE_TIMEOUT = timedelta(minutes=10)  # a desynchronised collective fails in minutes, not NCCL's default 30
# The ranks that wait for local rank 0's download of the base (16.4 GB for an 8 B model) wait in a collective of their
# own, on a gloo group with this timeout: the task's own runtime limit, so only the task's timeout ends a slow download
# (10 minutes would kill it below ~27 MB/s from the object store).
DOWNLOAD_TIMEOUT = CLUSTER_TIMEOUT.max_runtime


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def join_process_group() -> tuple[int, int, str, bool]:
    """(rank, world size, device, whether this call created the group): torchrun's group, or a one-rank gloo group.

    Each rank binds its own GPU (`cuda:<LOCAL_RANK>`) before NCCL initialises, as NCCL's object collectives expect.
    """
    import os

    import torch
    import torch.distributed as dist

    from rl.deploy.flyte.nccl_debug import apply_nccl_diagnostics

    apply_nccl_diagnostics()  # RL_NCCL_DEBUG=1: NCCL's and torch's diagnostics, before a communicator reads them
    if dist.is_initialized():
        # A group someone else made: its backend says where this rank computes (NCCL reduces CUDA tensors only, on the
        # device its creator bound with torch.cuda.set_device).
        device = f"cuda:{torch.cuda.current_device()}" if dist.get_backend() == "nccl" else "cpu"
        return dist.get_rank(), dist.get_world_size(), device, False
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        # A pod given GPUs joins NCCL on its own, or refuses in one line (rl.gpu.task_device); it never falls back to
        # gloo on the CPU. A CPU pod (or torchrun on a laptop) runs gloo.
        device = task_device(int(os.environ.get("LOCAL_RANK", "0")))
        if device != "cpu":
            torch.cuda.set_device(torch.device(device))
            dist.init_process_group("nccl", timeout=COLLECTIVE_TIMEOUT)
            return dist.get_rank(), dist.get_world_size(), device, True
        dist.init_process_group("gloo", timeout=COLLECTIVE_TIMEOUT)
        return dist.get_rank(), dist.get_world_size(), "cpu", True
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1, timeout=COLLECTIVE_TIMEOUT
    )
    return 0, 1, "cpu", True


def node_cache() -> Path:
    """This pod's base-model cache: `$RL_NODE_CACHE`, else `rl-base-models` in the temp dir (the pod's ephemeral disk,
    which `cluster_train_env` requests)."""
    return Path(os.environ.get(NODE_CACHE_ENV) or Path(tempfile.gettempdir()) / "rl-base-models")


async def _download_once(base: Dir, target: Path) -> None:
    """Copy `base` to `target` unless a finished copy is there; a copy appears only complete (renamed into place)."""
    if target.is_dir():
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".partial-", dir=target.parent))
    try:
        await base.download(staging / "model")
        (staging / "model").rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


async def node_base(base: Dir, rank: int, device: str, failed: Exception | None = None) -> Path:
    """The base model on this pod's disk: local rank 0 downloads it, then every rank of the group agrees it did.

    Outside torchrun (no `LOCAL_RANK`) the one process downloads it as every other task does (`local_base`).

    The agreement (`rl.trainer.rank_agreement.agree`) is one all-reduce every rank reaches, so a failed download, or
    `failed` (an error this rank already had, e.g. staging its inputs), fails every rank at once with
    `RankFailedError` naming the rank, instead of leaving the others waiting on the file. It runs on a gloo group
    whose timeout is `DOWNLOAD_TIMEOUT`, not the step's `COLLECTIVE_TIMEOUT`: a slow download is not a desynchronised
    collective.
    """
    import torch

    from rl.trainer.rank_agreement import agree

    if "LOCAL_RANK" not in os.environ:  # not under torchrun (Flyte's local mode): one rank, nothing to share
        if failed is not None:
            raise failed
        return await local_base(base)
    # Keyed on the content digest where the Dir carries one, so a retry's fresh upload of the same model is reused.
    target = node_cache() / content_digest(base.hash or base.path)
    error = failed
    if error is None and int(os.environ.get("LOCAL_RANK", "0")) == 0:
        try:
            await _download_once(base, target)
        except Exception as exc:
            error = exc
    import torch.distributed as dist

    waiting = dist.new_group(backend="gloo", timeout=DOWNLOAD_TIMEOUT)  # every rank calls it, in the same order
    try:
        agree(error, torch.device("cpu"), where=f"staging its inputs and the base model {base.path}", group=waiting)
    finally:
        dist.destroy_process_group(waiting)
    return target


async def _stage(store_root: Path, directory: Dir, name: str) -> ArtifactRef:
    """Copy a Dir artifact (verified against its digest) into this rank's local store."""
    from rl.storage.artifacts import LocalArtifacts

    files = await DirArtifacts().get(ref_of(directory))
    return await LocalArtifacts(store_root).put(files, name=name)


async def _publish(store_root: Path, ref: ArtifactRef, name: str) -> str:
    """Upload an artifact of the local store as a Dir; returns its path (rank 0 only)."""
    from rl.storage.artifacts import LocalArtifacts

    with tempfile.TemporaryDirectory(prefix="rl-publish-") as tmp:
        local = await LocalArtifacts(store_root).materialize(ref, Path(tmp) / name)
        return (await upload_dir(local, name)).path


@cluster_train_env.task(retries=1, timeout=CLUSTER_TIMEOUT)
async def train_step_clustered(base: Dir, adapter: Dir, optimizer_state: Dir, batch: TrainInput) -> TrainOutput:
    """One GRPO step on every rank (DDP over the LoRA adapter); the result equals the single-process step's."""
    import torch.distributed as dist

    from rl.trainer.ddp import ddp_train_step
    from rl.trainer.rank_agreement import broadcast_outcome
    from rl.types import TrainResult

    quiet_transformers()
    rank, world_size, device, own_group = join_process_group()
    try:
        with tempfile.TemporaryDirectory(prefix=f"rl-rank{rank}-") as tmp:
            root = Path(tmp)
            # Every failure of one rank is agreed on at the next collective, so no rank waits on a peer that raised.
            staged, error = None, None
            try:
                staged = batch.batch(
                    await _stage(root, adapter, "adapter-in"),
                    None if optimizer_state.is_empty else await _stage(root, optimizer_state, "optimizer-in"),
                )
            except Exception as exc:
                error = exc
            base_dir = await node_base(base, rank, device, failed=error)
            assert staged is not None  # else node_base raised
            result: TrainResult = ddp_train_step(rank, world_size, base_dir, root, staged, batch.trainer, device=device)
            published, error = None, None
            if rank == 0:
                try:
                    published = [
                        await _publish(root, result.adapter, f"adapter-v{batch.new_version}"),
                        await _publish(root, result.optimizer_state, f"optimizer-v{batch.new_version}"),
                    ]
                except Exception as exc:
                    error = exc
            paths = broadcast_outcome(published, error, where="publishing the adapter and optimizer state on rank 0")
    finally:
        if own_group:
            dist.destroy_process_group()
    adapter_path, optimizer_path = (str(p) for p in paths)
    return TrainOutput(
        adapter=Dir.from_existing_remote(adapter_path, dir_cache_key=result.adapter.digest),
        optimizer_state=Dir.from_existing_remote(optimizer_path, dir_cache_key=result.optimizer_state.digest),
        policy_version=result.policy_version,
        metrics=result.metrics,
    )


PIPELINED = GrpoRunConfig().replace(grpo=replace(GrpoRunConfig().grpo, pipelined=True))


@grpo_clustered_driver_env.task(report=True, retries=2)
async def train_rl_clustered(config: GrpoRunConfig = PIPELINED) -> GrpoRunResult:
    """The pipelined loop: iteration N+1 generates (one step stale) while the clustered trainer trains N.

    The clipped importance ratio in the trainer's loss is what makes one-step-stale rollouts sound; `max_staleness`
    in the config bounds it. `config.grpo.pipelined=False` runs the same loop sequentially, for comparison.
    """
    return await run_driver(config, step_task=train_step_clustered, title="GRPO + LoRA, clustered trainer")
