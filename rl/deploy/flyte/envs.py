"""One `flyte.TaskEnvironment` per tier, each its own failure domain: resources, retries and timeouts are its own.

GRPO: `rollout` (vLLM, a GPU pod), `rollout-cpu` (the torch sampler, a CPU pod), `reward`, `train` (PEFT),
`train-cluster` (a `ClusteredTaskEnvironment` under `TorchRun`, restarted together by `ClusterFailurePolicy`) and two
small CPU drivers whose `depends_on` names every tier they call, so deploying a driver deploys its loop. Agentic:
`sandbox`, `judge`, `trainer` and a driver, all CPU.

Sizing is fixed at deploy time from the client's environment, re-injected into every environment so a task's import
in its container sees the same values: `RL_FLYTE_TIERS` (`gpu`, the default, `cpu` or `stress`), `RL_FLYTE_GPU`
(default `L4`) and `RL_FLYTE_REUSE=1` (warm rollout replicas; Union only). The image is this package installed by
`uv sync`, a layer declared only client-side. Each tier's size: docs/flyte.md (Tier sizes).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import flyte
from flyte.clustered import ClusteredTaskEnvironment, ClusterFailurePolicy, TorchRun

from rl.deploy.flyte.config import ENGINES, reuse_enabled
from rl.errors import RolloutPlacementError
from rl.gpu_settings import named_gpu

TIERS = os.environ.get("RL_FLYTE_TIERS", "gpu")
GPU_TYPE = named_gpu()
REUSE = reuse_enabled()
PYPROJECT = Path(__file__).resolve().parents[3] / "pyproject.toml"
DOCKERIGNORE = Path(__file__).resolve().parent / "image.dockerignore"  # caches, venvs and runs stay out of the image

# The same values inside every task's container; models arrive as flyte.io.Dir, so nothing reaches for the Hub.
ENV_VARS = {
    "RL_FLYTE_TIERS": TIERS,
    "RL_FLYTE_GPU": GPU_TYPE,
    "RL_FLYTE_REUSE": "1" if REUSE else "0",
    "HF_HUB_OFFLINE": "1",
    "RL_NCCL_DEBUG": os.environ.get("RL_NCCL_DEBUG", "0"),  # NCCL's diagnostics on (rl.deploy.flyte.nccl_debug)
}

ROLLOUT_ENV_VARS = {
    **ENV_VARS,
    # vLLM starts its engine core in a child process; forking a process that already runs threads (Flyte's runtime,
    # asyncio, torch's pools) can deadlock the child, so rollout tasks make vLLM spawn it instead.
    "VLLM_WORKER_MULTIPROC_METHOD": "spawn",
}


@dataclass(frozen=True)
class TierSizing:
    """Per-pod resources of each GRPO tier and the clustered trainer's shape for one `RL_FLYTE_TIERS` value. Each
    rollout engine has its own pod: vLLM a GPU (`vllm_rollout`), the torch sampler, which has no device code, a CPU
    (`torch_rollout`); `gpus=False` tiers deploy no GPU pod, so no vLLM rollouts (`check_engine_placement`)."""

    vllm_rollout: flyte.Resources
    torch_rollout: flyte.Resources
    train: flyte.Resources
    cluster_pod: flyte.Resources
    cluster_replicas: int
    cluster_nproc_per_node: int
    rollout_replicas: int | tuple[int, int]
    gpus: bool = True


def _gpu(cpu: int, memory: str, gpus: int, disk: str) -> flyte.Resources:
    gpu = flyte.GPU(GPU_TYPE, gpus)  # type: ignore[arg-type]
    return flyte.Resources(cpu=cpu, memory=memory, gpu=gpu, shm="auto", disk=disk)


# Ephemeral disk per pod: each pod downloads the base model once (the clustered trainer's local rank 0 alone, see
# rl.deploy.flyte.clustered.node_base) beside small adapter copies. An 8B model is 16.4 GB in bf16 and 32.8 GB if saved
# in float32, so the stress pods ask for 100Gi; the gpu tier's models are small, 50Gi leaves room for a mid-size one.
GPU_DISK, STRESS_DISK = "50Gi", "100Gi"


def sizing(tiers: str = TIERS) -> TierSizing:
    """The tier sizes for `tiers` (`gpu`, `cpu` or `stress`)."""
    cpu = flyte.Resources(cpu=2, memory="4Gi", disk="10Gi")
    if tiers == "gpu":
        one = _gpu(4, "24Gi", 1, GPU_DISK)
        return TierSizing(one, cpu, one, one, 2, 1, (1, 4))
    if tiers == "cpu":  # vLLM's pod is declared (its tasks import) but no driver deploys it
        return TierSizing(_gpu(4, "24Gi", 1, GPU_DISK), cpu, cpu, cpu, 2, 1, (1, 2), gpus=False)
    if tiers == "stress":
        rollout, train = _gpu(6, "40Gi", 1, STRESS_DISK), _gpu(8, "60Gi", 1, STRESS_DISK)
        return TierSizing(rollout, cpu, train, _gpu(16, "120Gi", 4, STRESS_DISK), 2, 4, (2, 4))
    raise ValueError(f"RL_FLYTE_TIERS must be 'gpu', 'cpu' or 'stress', got {tiers!r}")


ENGINE_USES_GPU = {"vllm": True, "torch": False}  # the torch sampler has no device code; vLLM needs CUDA here


def check_rollout_pod(engine: str, resources: flyte.Resources) -> None:
    """Refuse (`RolloutPlacementError`, one line) a rollout pod its engine cannot use: the torch sampler given a GPU
    (it would idle, booked) or vLLM given none."""
    if engine not in ENGINE_USES_GPU:
        raise RolloutPlacementError(f"rollout engine must be one of {ENGINES}, got {engine!r}")
    if ENGINE_USES_GPU[engine] and resources.gpu is None:
        raise RolloutPlacementError(
            "vLLM rollouts on a CPU pod: vLLM's GPU build needs CUDA; give its rollout pod a GPU (RL_FLYTE_TIERS=gpu "
            "or stress) or use engine kind 'torch'"
        )
    if not ENGINE_USES_GPU[engine] and resources.gpu is not None:
        raise RolloutPlacementError(
            f"torch-sampler rollouts on a GPU pod ({resources.gpu}): the torch sampler computes on the CPU, so the GPU "
            "would idle, booked; give its rollout pod no GPU or use engine kind 'vllm'"
        )


def check_engine_placement(engine: str, sizes: TierSizing | None = None) -> None:
    """Refuse (`RolloutPlacementError`, one line) a run whose rollout engine has no pod in these tiers: vLLM where
    `RL_FLYTE_TIERS` deploys no GPU. Called before a run is submitted and again by its driver before any task."""
    sizes = SIZES if sizes is None else sizes
    if ENGINE_USES_GPU.get(engine) and not sizes.gpus:
        raise RolloutPlacementError(
            f"engine kind {engine!r} needs a GPU rollout pod, and RL_FLYTE_TIERS={TIERS} deploys none; deploy "
            "RL_FLYTE_TIERS=gpu or stress, or use engine kind 'torch' (the smoke profile)"
        )


def rollout_environment(engine: str, sizes: TierSizing) -> flyte.TaskEnvironment:
    """The rollout tier of `engine` ("vllm" or "torch"): its own pod (`sizes`), checked by `check_rollout_pod`."""
    resources = sizes.vllm_rollout if engine == "vllm" else sizes.torch_rollout
    check_rollout_pod(engine, resources)
    on_gpu = ENGINE_USES_GPU[engine]
    return flyte.TaskEnvironment(
        name="rl-grpo-rollout" if on_gpu else "rl-grpo-rollout-cpu",
        description=(
            "GRPO rollouts on vLLM (a GPU pod): as many groups per call as the GPU's plan allows, from the requested "
            "LoRA adapter."
            if on_gpu
            else "GRPO rollouts on the torch sampler (a CPU pod): one group per call from the requested LoRA adapter."
        ),
        image=rl_image(True) if on_gpu else rl_image(False),
        resources=resources,
        env_vars=ROLLOUT_ENV_VARS if on_gpu else ENV_VARS,
        # concurrency=1: one engine per replica batches internally; parallelism comes from replicas.
        reusable=flyte.ReusePolicy(replicas=sizes.rollout_replicas, concurrency=1, idle_ttl=600) if REUSE else None,
    )


def rl_image(gpu: bool) -> flyte.Image:
    """The Debian base image with this project installed by `uv sync` (plus vLLM when `gpu`)."""
    image = flyte.Image.from_debian_base(name="flyte-rl-gpu" if gpu else "flyte-rl", python_version=(3, 11))
    if PYPROJECT.is_file():  # client side, where the project is; in a container the package is already installed
        image = image.with_dockerignore(DOCKERIGNORE).with_uv_project(
            PYPROJECT, project_install_mode="install_project", extra_args="--extra gpu" if gpu else None
        )
    if REUSE:
        image = image.with_pip_packages("unionai-reuse>=0.1.3")
    return image


def cpu_environment(name: str, description: str, cpu: int | str, memory: str, **more: Any) -> flyte.TaskEnvironment:
    """A CPU tier's environment: the CPU image, `cpu` and `memory`, the tiers' environment variables; `more` as
    `flyte.TaskEnvironment` takes it (`depends_on`)."""
    return flyte.TaskEnvironment(
        name=name,
        description=description,
        image=cpu_image,
        resources=flyte.Resources(cpu=cpu, memory=memory),
        env_vars=ENV_VARS,
        **more,
    )


SIZES = sizing()
GPU_TIERS = TIERS != "cpu"
image = rl_image(GPU_TIERS)
cpu_image = rl_image(False)

# Per-tier timeouts: a bound on one attempt's running time, so a hung engine or a stuck collective fails and retries.
ROLLOUT_TIMEOUT = flyte.Timeout(max_runtime=timedelta(minutes=20))
REWARD_TIMEOUT = flyte.Timeout(max_runtime=timedelta(minutes=5))
BUFFER_TIMEOUT = flyte.Timeout(max_runtime=timedelta(minutes=10))
TRAIN_TIMEOUT = flyte.Timeout(max_runtime=timedelta(minutes=30))
CLUSTER_TIMEOUT = flyte.Timeout(max_runtime=timedelta(minutes=45), max_queued_time=timedelta(minutes=30))

# ----------------------------------------------------------------------------------------------------- GRPO tiers

rollout_env = rollout_environment("vllm", SIZES)
cpu_rollout_env = rollout_environment("torch", SIZES)
# What the drivers deploy: the torch sampler's CPU pods always, vLLM's GPU pods where the tiers have GPUs.
ROLLOUT_ENVS = [rollout_env, cpu_rollout_env] if SIZES.gpus else [cpu_rollout_env]

reward_env = cpu_environment(
    "rl-grpo-reward",
    "GRPO rewards: the verifiable reward over one group per call. CPU only.",
    cpu=1,
    memory="2Gi",
)

train_env = flyte.TaskEnvironment(
    name="rl-grpo-train",
    description="GRPO trainer: one PEFT LoRA step per call, adapter and optimizer state in and out as directories.",
    image=image,
    resources=SIZES.train,
    env_vars=ENV_VARS,
)

cluster_train_env = ClusteredTaskEnvironment(
    name="rl-grpo-train-cluster",
    description="GRPO trainer across nodes: DDP over the LoRA adapter; rank 0 saves and broadcasts.",
    image=image,
    resources=SIZES.cluster_pod,  # per pod
    env_vars=ENV_VARS,
    replicas=SIZES.cluster_replicas,
    nproc_per_node=SIZES.cluster_nproc_per_node,
    # Static rendezvous and no in-pod restarts: when any rank fails the JobSet restarts as a whole (partial restarts
    # would leave ranks out of step), up to twice, before the attempt fails and the task's own retries take over.
    runtime=TorchRun(rdzv_backend="static", max_restarts=0),
    failure_policy=ClusterFailurePolicy(max_restarts=2, restart_on_host_maintenance=True),
)

buffer_env = cpu_environment(
    "rl-grpo-buffer",
    "The rollout buffer: each iteration's rollouts added to a new version of the buffer.",
    cpu=2,
    memory="4Gi",
)

grpo_driver_env = cpu_environment(
    "rl-grpo-driver",
    "The GRPO loop: fans out rollouts, scores groups as they land, trains, checkpoints, reports.",
    cpu=1,
    memory="2Gi",
    depends_on=[*ROLLOUT_ENVS, reward_env, train_env, buffer_env],
)

grpo_clustered_driver_env = cpu_environment(
    "rl-grpo-driver-clustered",
    "The pipelined GRPO loop: generation of N+1 overlaps the clustered train step of N.",
    cpu=1,
    memory="2Gi",
    # train_env still serves build_base and init_adapter.
    depends_on=[*ROLLOUT_ENVS, reward_env, train_env, buffer_env, cluster_train_env],
)

# --------------------------------------------------------------------------------------------------- agentic tiers

sandbox_env = cpu_environment(
    "rl-agentic-sandbox",
    "Agentic trials: one pod per trial, a private copy of its world.",
    cpu="500m",
    memory="1Gi",
)

judge_env = cpu_environment(
    "rl-agentic-judge",
    "Verifier plus rubric judge; the judge call is traced so a retry never bills it twice.",
    cpu="500m",
    memory="512Mi",
)

agentic_trainer_env = cpu_environment(
    "rl-agentic-trainer",
    "The bandit trainer: a pure step, weights in and weights out.",
    cpu=1,
    memory="2Gi",
)

agentic_driver_env = cpu_environment(
    "rl-agentic-driver",
    "The durable agentic loop: trials fan out, are judged as they land, one train step per step.",
    cpu=1,
    memory="1Gi",
    depends_on=[sandbox_env, judge_env, agentic_trainer_env],
)
