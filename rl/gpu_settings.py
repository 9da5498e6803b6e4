"""Settings derived from the GPU a deployment names (`RL_FLYTE_GPU`), each from `rl plan`'s own arithmetic
(`rl.commands.plan.plan_profile` over `rl.memory_plan`), never a constant sized for one card:

- the trainer's micro-batch: the largest power of two whose plan fits the GPU with the estimator's margin;
- vLLM's batch: the most groups of one iteration whose sequences the KV cache holds at once (`groups_per_call`, what
  one rollout task decodes in one `generate` call), and `max_num_seqs` equal to that call's sequences.

Eager or CUDA graphs is chosen once, by `rl.gpu.vllm_enforce_eager`. Why each: docs/gpu.md#settings-follow-the-gpu.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from rl.memory_plan import GIB, PlanDoesNotFitError, TaskPlan, gpu

__all__ = [
    "DEFAULT_GPU",
    "ESTIMATE_LOW",
    "GPU_ENV",
    "RolloutBatch",
    "fits_with_margin",
    "micro_batch_for",
    "named_gpu",
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


def _plans(config: Any, gpu_name: str) -> list[TaskPlan]:
    from rl.commands.plan import plan_profile

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
    from rl.commands.plan import profile_tokens

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
