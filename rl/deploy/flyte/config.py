"""Run configuration for the Flyte tasks: typed task inputs and the `smoke`, `gpu-smoke` and `stress` profiles.

Everything a run can vary travels as a task input (frozen dataclasses Flyte's type engine serialises), so it is part of
each action's identity and shows in the UI. What a run *cannot* vary — the resources, GPUs and replica counts of each
tier — is fixed when the environments are declared; `rl.deploy.flyte.envs` reads it from environment variables at deploy
time. Each profile's model, engine, shape and trainer: docs/flyte.md (Profiles).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pydantic import Field, model_validator

from rl.deploy.flyte.strict import StrictConfig
from rl.errors import ConfigError
from rl.loop.grpo import GrpoConfig
from rl.models.tiny import TinyModelConfig
from rl.problems import PROBLEM_SETS, problem_set
from rl.samplers.vllm import VLLM_MAX_LORA_RANKS
from rl.samplers.vllm_requests import check_vllm_sampling
from rl.trainer.config import TrainerConfig

ENGINES = ("torch", "vllm")
# How the GPU profiles hold their base model for training (the CPU profiles keep TrainerConfig's defaults, which the
# demo's recorded numbers come from).
REAL_SIZE_TRAINER: dict[str, Any] = {"base_dtype": "bfloat16", "attention": "sdpa", "gradient_checkpointing": True}


@dataclass(frozen=True)
class EngineSpec:
    """Which rollout engine a `generate` / `evaluate` task builds, and its knobs.

    `kind="torch"`: `rl.samplers.torch_sampler.TorchSampler` on the CPU (`threads`, `merge_adapters`).
    `kind="vllm"`: `rl.samplers.vllm.VLLMEngine` on the task's GPU; `vllm` is imported only then. `token_ids=True` sends
    prompt token ids and decodes with the model's own tokenizer (required for the tiny character model). vLLM's
    attention kernels need a head dimension of 64 or more, so the smoke profile's tiny model (64 wide over 4 heads)
    runs on the torch sampler; to try vLLM on a tiny model, build one 256 wide over 4 heads (`ModelSpec.tiny`).
    `max_model_len=None` leaves vLLM's context length to the model's config; vLLM refuses a longer one.
    `max_num_seqs=None` leaves vLLM's batch default; `groups_per_call` is how many groups one rollout task decodes in
    one `generate` call (vLLM only; the GPU profiles derive both from `rl plan`, `rl.gpu_settings`).
    `enforce_eager=None` takes `rl.gpu.vllm_enforce_eager`'s choice in the pod, the one `rl bench --gpu` measures.
    """

    # Validated from JSON (a Flyte `--config`) through pydantic: a key that is not a field is refused, not dropped.
    __pydantic_config__: ClassVar[dict[str, str]] = {"extra": "forbid"}

    kind: str = "torch"
    threads: int = 1
    merge_adapters: bool = True
    token_ids: bool = True
    gpu_memory_utilization: float = 0.85
    max_model_len: int | None = None  # None: the model's own length (its config's max_position_embeddings)
    max_lora_rank: int = 16
    enforce_eager: bool | None = None  # None: rl.gpu.vllm_enforce_eager decides (production and the bench alike)
    max_num_seqs: int | None = None  # None: vLLM's default for the GPU (rl.memory_plan.vllm_batch_defaults)
    groups_per_call: int = 1

    def __post_init__(self) -> None:
        if self.kind not in ENGINES:
            raise ConfigError(f"engine kind must be one of {ENGINES}, got {self.kind!r}")
        if self.threads < 1:
            raise ConfigError(f"engine threads must be >= 1, got {self.threads}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ConfigError(f"engine gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if (self.max_model_len is not None and self.max_model_len < 1) or self.max_lora_rank < 1:
            raise ConfigError(
                f"engine max_model_len and max_lora_rank must be >= 1, got {self.max_model_len} and "
                f"{self.max_lora_rank}"
            )
        if self.groups_per_call < 1 or (self.max_num_seqs is not None and self.max_num_seqs < 1):
            raise ConfigError(
                f"engine groups_per_call and max_num_seqs must be >= 1, got {self.groups_per_call} and "
                f"{self.max_num_seqs}"
            )
        if self.kind == "torch" and self.groups_per_call != 1:
            raise ConfigError(
                f"engine groups_per_call={self.groups_per_call} is vLLM's: the torch sampler's CPU pods take one group "
                "per call (parallelism comes from pods); set it to 1 or use engine kind 'vllm'"
            )
        if self.kind == "vllm" and self.max_lora_rank not in VLLM_MAX_LORA_RANKS:
            raise ConfigError(
                f"engine.max_lora_rank={self.max_lora_rank} is not a rank vLLM accepts "
                f"({', '.join(map(str, VLLM_MAX_LORA_RANKS))}); pick the smallest one >= trainer.lora_rank"
            )

    def vllm_kwargs(self, model_max_len: int) -> dict[str, object]:
        """Keyword arguments for `vllm.LLM` beyond what the engine sets itself, for a model of `model_max_len`
        positions (`rl.samplers.vllm_requests.model_max_len`)."""
        if self.max_model_len is not None and self.max_model_len > model_max_len:
            raise ConfigError(
                f"engine.max_model_len={self.max_model_len} exceeds the model's {model_max_len} positions, which vLLM "
                "refuses; leave it None (the model's own length) or set at most that"
            )
        from rl.gpu import vllm_enforce_eager

        eager = vllm_enforce_eager(reuse=reuse_enabled()) if self.enforce_eager is None else self.enforce_eager
        batch = {} if self.max_num_seqs is None else {"max_num_seqs": self.max_num_seqs}
        return {
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "max_model_len": self.max_model_len or model_max_len,
            "max_lora_rank": self.max_lora_rank,
            "max_loras": 2,  # a pipelined loop samples version N+1 while evaluating N
            "enforce_eager": eager,
            **batch,
        }


@dataclass(frozen=True)
class ModelSpec:
    """The base model: `uri` (a Hugging Face model directory already in your object store) or, when empty, the tiny
    model built offline from `tiny` by the cached `build_base` task."""

    # Validated from JSON (a Flyte `--config`) through pydantic: a key that is not a field is refused, not dropped.
    __pydantic_config__: ClassVar[dict[str, str]] = {"extra": "forbid"}

    uri: str = ""
    tiny: TinyModelConfig = field(default_factory=lambda: TinyModelConfig(seed=0, initializer_range=0.2))


class FaultSpec(StrictConfig):
    """Failure injection for demonstrations and tests (`rl.deploy.flyte.grpo_faults`; the production drivers take none):
    the driver dies once, right after checkpointing an iteration.

    The crash happens when `crash_after_iteration` has just been checkpointed, on a driver attempt whose
    `FLYTE_ATTEMPT_NUMBER` is 0 and while `crash_marker` (a file path, if given) does not exist; the marker is written
    just before the crash. On a cluster the attempt number alone makes it fire once; Flyte's local mode never sets the
    attempt number, so local runs need the marker. A pydantic model, not a dataclass: as a task's own input, Flyte's
    CLI would drop a misspelt `--faults` key of a dataclass without a word.
    """

    crash_after_iteration: int = -1
    crash_marker: str = ""

    @model_validator(mode="after")
    def _check(self) -> FaultSpec:
        if self.crash_after_iteration < -1:
            raise ValueError(
                f"faults.crash_after_iteration must be -1 (no crash) or an iteration, got {self.crash_after_iteration}"
            )
        return self


class GrpoRunConfig(StrictConfig):
    """One GRPO run: the loop's shape (`grpo`, whose digest guards the checkpoint), the model, engine, trainer, reward
    and problem set. Build one with `smoke()` or `stress(base_uri=...)` and adjust with `.replace(...)`.

    Everything is checked when it is built — from Python or from `--config` JSON — so a run that cannot work (an
    unknown key or reward, `iterations` 0, a negative learning rate) fails before
    its first task starts."""

    profile: str = "smoke"
    grpo: GrpoConfig = Field(
        default_factory=lambda: GrpoConfig(iterations=3, prompts_per_iteration=4, group_size=8, max_tokens=4, eval_k=2)
    )
    model: ModelSpec = Field(default_factory=ModelSpec)
    engine: EngineSpec = Field(default_factory=EngineSpec)
    trainer: TrainerConfig = Field(default_factory=lambda: TrainerConfig(lr=1e-2, threads=1))
    reward: str = "default"
    problems: str = "digits"
    # The rollout buffer: one Dir version per iteration (see rl.deploy.flyte.grpo_tasks.add_rollouts).
    keep_rollouts: bool = True

    @model_validator(mode="after")
    def _check(self) -> GrpoRunConfig:
        self.check()
        return self

    def check(self) -> None:
        """Raise `ConfigError` (or the loop's `GrpoInputError`, the reward's `UnknownRewardError`) for a run that
        cannot work; `run_driver` calls it again before its first task."""
        from rl.rewards import get_reward

        if self.problems not in PROBLEM_SETS:
            raise ConfigError(f"problems must be one of {sorted(PROBLEM_SETS)}, got {self.problems!r}")
        if self.model.uri == "" and self.engine.kind == "vllm" and not self.engine.token_ids:
            raise ConfigError(
                "the tiny model's character tokenizer only works with vLLM given token ids: set engine.token_ids=True"
            )
        if self.engine.kind == "vllm" and self.trainer.lora_rank > self.engine.max_lora_rank:
            raise ConfigError(
                f"trainer.lora_rank={self.trainer.lora_rank} exceeds engine.max_lora_rank={self.engine.max_lora_rank}: "
                "vLLM would refuse every adapter at the first generate; raise engine.max_lora_rank to a rank vLLM "
                "accepts that is >= the trainer's, or lower trainer.lora_rank"
            )
        if self.engine.kind == "vllm":
            check_vllm_sampling(self.grpo.sampling)  # VLLMSamplingError: settings vLLM cannot sample as declared
        get_reward(self.reward)
        self.grpo.validate(problem_set(self.problems).train_prompts())

    def check_faults(self, faults: FaultSpec) -> None:
        """Refuse an injected fault that cannot work with this run (`train_rl_with_faults`), before any task starts."""
        if faults.crash_after_iteration >= self.grpo.iterations:
            raise ConfigError(
                f"faults.crash_after_iteration {faults.crash_after_iteration} is beyond the run's "
                f"{self.grpo.iterations} iterations (0..{self.grpo.iterations - 1}); pick one of those, or -1"
            )


def smoke(gpu: str | None = None, **changes: object) -> GrpoRunConfig:
    """The CPU-friendly profile (see the module docstring); keyword arguments replace top-level fields. `gpu` is
    ignored: nothing of it runs on a GPU (the torch sampler, a tiny model)."""
    return GrpoRunConfig(**changes)  # type: ignore[arg-type]  # pydantic validates each field's type


def stress(base_uri: str, gpu: str | None = None, **changes: object) -> GrpoRunConfig:
    """The examples' large profile on a prefetched model at `base_uri` (see the module docstring), its micro-batch and
    vLLM batch derived for `gpu` (default `RL_FLYTE_GPU`, else L4) by `rl.gpu_settings`."""
    from rl.gpu_settings import named_gpu, size_for_gpu

    if not base_uri:
        raise ConfigError("the stress profile needs base_uri: a model directory in your object store")
    config = GrpoRunConfig(
        profile="stress",
        grpo=GrpoConfig(
            iterations=20,
            prompts_per_iteration=32,
            group_size=6,
            max_tokens=512,
            pipelined=True,
            eval_k=4,
            eval_every=5,
        ),
        model=ModelSpec(uri=base_uri),
        engine=EngineSpec(kind="vllm", token_ids=False, max_model_len=2048, max_lora_rank=16),
        # An 8 B base must be held in bfloat16 (float32 is 33 GB, past an L4's 24), with sdpa (eager keeps every
        # head's [T, T] probabilities) and checkpointing; the micro-batch is the GPU's (size_for_gpu, below: 2 on an
        # L4 keeps the [B, L, 151936] logits near 1 GB). `rl plan --profile stress --gpu L4` prints the sums.
        trainer=TrainerConfig(
            lora_rank=16,
            lora_alpha=32,
            lr=2e-5,
            target_modules=("k_proj", "o_proj", "q_proj", "v_proj"),
            threads=4,
            **REAL_SIZE_TRAINER,
        ),
        problems="arithmetic",
    )
    return size_for_gpu(config, gpu or named_gpu(), micro_batch=True).replace(**changes)


def gpu_smoke(gpu: str | None = None, **changes: object) -> GrpoRunConfig:
    """The smoke loop on the GPU tiers: vLLM rollouts from a tiny model wide enough for vLLM's attention kernels
    (`rl.gpu.VLLM_MODEL`, head dim 64), the trainer on the GPU, vLLM's batch derived for `gpu` (default
    `RL_FLYTE_GPU`, else L4). Not exercised by the CPU tests."""
    from rl.gpu import VLLM_MODEL
    from rl.gpu_settings import named_gpu, size_for_gpu

    config = GrpoRunConfig(
        profile="gpu-smoke",
        model=ModelSpec(tiny=VLLM_MODEL),
        engine=EngineSpec(kind="vllm", token_ids=True, max_lora_rank=8),
        # The CPU profile's 1e-2 overshoots on this wider model (gpu_tests/test_cuda_trainer.py measured it). Held
        # as the stress profile holds its 8 B base, so the first GPU run exercises the kernels the real one will.
        trainer=TrainerConfig(lr=1e-3, threads=1, **REAL_SIZE_TRAINER),
    )
    # The trainer keeps its micro-batch: the cuda trainer test measured this rate at it, and the tiny model fits any.
    return size_for_gpu(config, gpu or named_gpu(), micro_batch=False).replace(**changes)


PROFILES: dict[str, Callable[..., GrpoRunConfig]] = {"smoke": smoke, "gpu-smoke": gpu_smoke, "stress": stress}

REUSE_ENV = "RL_FLYTE_REUSE"


def reuse_enabled(environ: Mapping[str, str] | None = None) -> bool:
    """Whether `RL_FLYTE_REUSE=1` keeps rollout replicas warm (`flyte.ReusePolicy`; rl.deploy.flyte.envs reads it
    here)."""
    return (os.environ if environ is None else environ).get(REUSE_ENV, "0") == "1"


def reuse_warning(config: GrpoRunConfig, reuse: bool, base_bytes: int | None = None) -> str | None:
    """The cost of running `config`'s vLLM rollouts without warm replicas, in one line; None with reuse, or when the
    rollouts run on the torch sampler (a process-local engine, nothing to download)."""
    if reuse or config.engine.kind != "vllm":
        return None
    size = f" ({base_bytes / 1e9:.1f} GB)" if base_bytes else ""
    groups = config.engine.groups_per_call
    calls = -(-config.grpo.prompts_per_iteration // groups)  # the driver's rollout calls per iteration
    return (
        f"warning: {REUSE_ENV} is not 1: every rollout call starts its own pod, which downloads the base model{size} "
        f"and cold-starts vLLM for {groups} group(s): {calls} pods per iteration, "
        f"{calls * config.grpo.iterations} over {config.grpo.iterations} iterations, plus "
        f"evaluation; set {REUSE_ENV}=1 (Union's reusable containers) to keep the engine loaded between calls"
    )
