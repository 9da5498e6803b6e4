"""`rl plan`: a profile's GPU memory on paper (`rl.memory_plan`), per task, and a refusal when it does not fit.

The profile's model: the tiny model its `ModelSpec` builds, or, for `stress` (a model you prefetch), Qwen3-8B's
published architecture unless `--model-config` names the config.json of the model you will use.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from rl import strict_json
from rl.errors import PlanDoesNotFitError
from rl.gpu_settings import plan_profile, profile_arch, profile_tokens
from rl.memory_plan import GIB, gpu

__all__ = ["plan_profile", "profile_tokens", "register"]  # the plan itself: rl.gpu_settings


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
    from rl.deploy.flyte.config import PROFILES
    from rl.errors import InputError

    if name not in PROFILES:
        raise InputError(f"unknown profile {name!r}; choose one of {', '.join(sorted(PROFILES))}")
    # Each profile sized for the GPU planned (rl.gpu_settings), as a deploy naming it in RL_FLYTE_GPU gets it.
    return PROFILES[name]("plan://model", gpu=gpu_name) if name == "stress" else PROFILES[name](gpu=gpu_name)


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
    from rl.deploy.flyte.config import reuse_enabled, reuse_warning

    warning = reuse_warning(config, reuse_enabled(), profile_arch(config, args.model_config)[0].parameters() * 2)
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
