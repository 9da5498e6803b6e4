"""Settings derived from the GPU a deployment names (`RL_FLYTE_GPU`), each from `rl plan`'s own arithmetic
(`plan_profile`, here, over `rl.memory_plan`), never a constant sized for one card:

- the trainer's micro-batch: the largest power of two whose plan fits the GPU with the estimator's margin;
- vLLM's batch: the most groups of one iteration whose sequences the KV cache holds at once (`groups_per_call`, what
  one rollout task decodes in one `generate` call), and `max_num_seqs` equal to that call's sequences.

Eager or CUDA graphs is chosen once, by `rl.gpu.vllm_enforce_eager`. Why each: docs/gpu.md#settings-follow-the-gpu.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from rl.errors import PlanDoesNotFitError
from rl.memory_plan import GIB, TaskPlan, engine_plan, gpu

__all__ = [
    "DEFAULT_GPU",
    "ESTIMATE_LOW",
    "GPU_ENV",
    "RolloutBatch",
    "fits_with_margin",
    "micro_batch_for",
    "named_gpu",
    "plan_profile",
    "profile_arch",
    "profile_tokens",
    "rollout_batch_for",
    "size_for_gpu",
]

GPU_ENV, DEFAULT_GPU = "RL_FLYTE_GPU", "L4"
ESTIMATE_LOW = 0.85  # the plan may land up to 15% below a measured step's peak (tests/test_memory_plan.py's LOW)


def named_gpu(environ: Mapping[str, str] | None = None) -> str:
    """The GPU the deployment names: `RL_FLYTE_GPU`, else L4 (checked where settings are derived from it)."""
    return (os.environ if environ is None else environ).get(GPU_ENV, DEFAULT_GPU)


def fits_with_margin(plan: TaskPlan) -> bool:
    """Whether a trainer plan fits its budget after the step's terms (activations, logits) are raised by the margin the
    estimator may undercount them by."""
    step = plan.terms["activations"] + plan.terms["logits"]
    return plan.total + step * (1 / ESTIMATE_LOW - 1) <= plan.budget


def profile_arch(config: Any, model_config: str | None = None) -> tuple[Any, int]:
    """(architecture, its max positions) of the profile's model."""
    from pathlib import Path

    from rl.memory_plan import ModelArch
    from rl.models.qwen3 import QWEN3_8B, qwen3_config
    from rl.models.tiny import build_tokenizer, qwen2_config

    if model_config is not None:
        path = Path(model_config).expanduser()
        path = path / "config.json" if path.is_dir() else path
        arch = ModelArch.from_config_file(path)
        return arch, int(json.loads(path.read_text()).get("max_position_embeddings", 0))
    if config.model.uri:
        return ModelArch.from_hf_config(qwen3_config(QWEN3_8B).to_dict()), QWEN3_8B.max_position
    hf = qwen2_config(config.model.tiny, build_tokenizer())
    return ModelArch.from_hf_config(hf.to_dict()), config.model.tiny.max_position


def profile_tokens(config: Any) -> tuple[int, int]:
    """(prompt, completion) tokens of one sample of a `GrpoRunConfig`, as the plan counts them."""
    from rl.problems import problem_set

    # Characters bound tokens from above for any tokenizer that has a token per character (both of ours; BPE merges).
    return 1 + max(len(p.question) for p in problem_set(config.problems).train_prompts()), config.grpo.max_tokens


def plan_profile(config: Any, gpu_name: str, model_config: str | None = None) -> list[TaskPlan]:
    """The trainer's (one rank) and the rollout engine's plan for a `GrpoRunConfig` on `gpu_name` (`rl plan`'s)."""
    from dataclasses import replace

    from rl.memory_plan import trainer_plan

    device = gpu(gpu_name)
    arch, positions = profile_arch(config, model_config)
    prompt_tokens, completion_tokens = profile_tokens(config)
    trainer = trainer_plan(
        arch,
        config.trainer,
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        budget=device.memory_bytes,
        samples=config.grpo.prompts_per_iteration * config.grpo.group_size,  # a step's batch; one rank gets no more
        task=f"trainer (one rank, {device.name})",
    )
    from rl.memory_plan import CUDA_CONTEXT_BYTES

    trainer = replace(trainer, terms={**trainer.terms, "cuda_context": CUDA_CONTEXT_BYTES})
    plans = [trainer]
    if config.engine.kind == "vllm":
        engine = config.engine
        if engine.max_model_len is None:
            engine = replace(engine, max_model_len=positions)
        group_tokens = config.grpo.group_size * (prompt_tokens + completion_tokens)
        plans.append(engine_plan(arch, engine, group_tokens=group_tokens, device=device))
    return plans


def _plans(config: Any, gpu_name: str) -> list[TaskPlan]:
    return plan_profile(config, gpu_name)


def micro_batch_for(config: Any, gpu_name: str) -> int:
    """The largest power of two, at most a step's samples, whose trainer plan on `gpu_name` fits with the margin;
    `PlanDoesNotFitError` when even 1 does not."""
    samples = config.grpo.prompts_per_iteration * config.grpo.group_size
    best, batch = 0, 1
    while batch <= samples:
        trainer = _plans(config.replace(trainer=replace(config.trainer, micro_batch_size=batch)), gpu_name)[0]
        if not fits_with_margin(trainer):
            break
        best, batch = batch, batch * 2
    if best == 0:
        raise PlanDoesNotFitError(
            f"profile {config.profile} does not fit a {gpu(gpu_name).name}: trainer needs {trainer.total / GIB:.2f} "
            f"GiB of {trainer.budget / GIB:.2f} GiB at micro-batches of 1, with the plan's {1 - ESTIMATE_LOW:.0%} "
            "margin (largest: weights); book a larger GPU (`rl plan --gpu ...` prints the terms)"
        )
    return best


@dataclass(frozen=True)
class RolloutBatch:
    """vLLM's batch for one rollout task: the groups one `generate` call decodes and vLLM's `max_num_seqs`."""

    groups_per_call: int
    max_num_seqs: int


def rollout_batch_for(config: Any, gpu_name: str) -> RolloutBatch:
    """The most of an iteration's groups (at most `prompts_per_iteration`) whose sequences fit vLLM's KV cache at once
    on `gpu_name`, with `max_num_seqs` set to them (a smaller sampler peak leaves more KV cache); `PlanDoesNotFitError`
    when not even one group fits."""
    prompt, completion = profile_tokens(config)
    group_tokens = config.grpo.group_size * (prompt + completion)
    for groups in range(config.grpo.prompts_per_iteration, 0, -1):
        seqs = groups * config.grpo.group_size
        engine = _plans(config.replace(engine=replace(config.engine, max_num_seqs=seqs)), gpu_name)[-1]
        if engine.fits and engine.kv_tokens >= groups * group_tokens:
            return RolloutBatch(groups, seqs)
    raise PlanDoesNotFitError(
        f"profile {config.profile} does not fit a {gpu(gpu_name).name}: vLLM's KV cache does not hold one group of "
        f"{group_tokens:,} tokens; book a larger GPU or lower grpo.max_tokens (`rl plan --gpu ...` prints the terms)"
    )


def size_for_gpu(config: Any, gpu_name: str, *, micro_batch: bool) -> Any:
    """`config` (a `GrpoRunConfig`) with its settings derived for `gpu_name`: vLLM's batch when its engine is vLLM, and
    the trainer's micro-batch when `micro_batch`. An unknown name is refused (`UnknownGpuError`, naming the known)."""
    gpu(gpu_name)
    if micro_batch:
        config = config.replace(trainer=replace(config.trainer, micro_batch_size=micro_batch_for(config, gpu_name)))
    if config.engine.kind == "vllm":
        batch = rollout_batch_for(config, gpu_name)
        engine = replace(config.engine, max_num_seqs=batch.max_num_seqs, groups_per_call=batch.groups_per_call)
        config = config.replace(engine=engine)
    return config
