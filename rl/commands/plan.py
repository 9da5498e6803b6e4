"""`rl plan`: a profile's GPU memory on paper (`rl.memory_plan`), per task, and a refusal when it does not fit.

The profile's model: the tiny model its `ModelSpec` builds, or, for `stress` (a model you prefetch), Qwen3-8B's
published architecture unless `--model-config` names the config.json of the model you will use.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from rl import strict_json
from rl.memory_plan import (
    GIB,
    PlanDoesNotFitError,
    TaskPlan,
    engine_plan,
    gpu,
)

__all__ = ["plan_profile", "register"]


def register(subparsers: argparse._SubParsersAction) -> None:
    from rl.memory_plan import GPUS

    p = subparsers.add_parser(
        "plan", help="estimate each GPU task's memory for a profile; refuse one that does not fit its GPU"
    )
    p.add_argument("--profile", default="stress", help="smoke, gpu-smoke or stress (default stress)")
    p.add_argument(
        "--gpu",
        default=os.environ.get("RL_FLYTE_GPU", "L4"),
        help=f"the GPU each task gets: {', '.join(g.name for g in GPUS.values())} (default $RL_FLYTE_GPU, else L4)",
    )
    p.add_argument(
        "--model-config",
        default=None,
        help="the config.json (or model directory) of the model the profile will load; stress defaults to Qwen3-8B",
    )
    p.add_argument("--json", action="store_true", help="end with one JSON object of every term, in bytes")
    p.set_defaults(func=run)


def _profile(name: str, gpu_name: str) -> Any:
    from rl.errors import InputError
    from rl.flyte.config import PROFILES

    if name not in PROFILES:
        raise InputError(f"unknown profile {name!r}; choose one of {', '.join(sorted(PROFILES))}")
    # Each profile sized for the GPU planned (rl.gpu_settings), as a deploy naming it in RL_FLYTE_GPU gets it.
    return PROFILES[name]("plan://model", gpu=gpu_name) if name == "stress" else PROFILES[name](gpu=gpu_name)


def _arch(config: Any, model_config: str | None) -> tuple[Any, int]:
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
    """The trainer's (one rank) and the rollout engine's plan for a `GrpoRunConfig` on `gpu_name`."""
    from dataclasses import replace

    from rl.memory_plan import trainer_plan

    device = gpu(gpu_name)
    arch, positions = _arch(config, model_config)
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


def run(args: argparse.Namespace) -> int:
    config = _profile(args.profile, args.gpu)
    plans = plan_profile(config, args.gpu, args.model_config)
    print(f"profile {args.profile} on {gpu(args.gpu).name} ({gpu(args.gpu).memory_bytes / GIB:.1f} GiB)")
    if config.engine.kind != "vllm":
        print(f"engine: the torch sampler ({config.engine.kind}), on the CPU: no GPU memory")
    for plan in plans:
        for line in plan.lines():
            print(line)
    if args.json:
        terms = {p.task.split(" ")[0]: {**p.terms, "total": p.total, "budget": p.budget} for p in plans}
        print(strict_json.dumps(terms))
    from rl.flyte.config import reuse_enabled, reuse_warning

    warning = reuse_warning(config, reuse_enabled(), _arch(config, args.model_config)[0].parameters() * 2)
    if warning is not None:
        print(warning, file=sys.stderr)
    short = [p for p in plans if not p.fits]
    if short:
        worst = short[0]
        raise PlanDoesNotFitError(
            f"profile {args.profile} does not fit a {gpu(args.gpu).name}: {worst.task.split(' (')[0]} needs "
            f"{worst.total / GIB:.2f} GiB of {worst.budget / GIB:.2f} GiB "
            f"(largest: {max(worst.terms, key=worst.terms.__getitem__)}); lower trainer.micro_batch_size, train "
            "bfloat16 with sdpa and checkpointing, or book a larger GPU"
        )
    return 0
