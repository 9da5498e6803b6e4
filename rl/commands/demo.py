"""`rl demo grpo` (the GRPO loop on the real CPU stack, learning the digit task) and `rl demo agentic`."""

from __future__ import annotations

import argparse
import json
import time

from rl.commands import user_path
from rl.strict_json import flag_non_finite


def register(subparsers: argparse._SubParsersAction) -> None:
    demo = subparsers.add_parser("demo", help="run a loop end to end on this machine")
    loops = demo.add_subparsers(dest="loop", metavar="LOOP", required=True)
    grpo = loops.add_parser("grpo", help="GRPO + LoRA on a tiny offline model, learning a prompt-dependent task")
    grpo.add_argument("--iterations", type=int, default=120, help="training iterations (default 120)")
    grpo.add_argument("--seed", type=int, default=0, help="run seed: prompts, rollouts, LoRA init (default 0)")
    grpo.add_argument(
        "--out", type=user_path, default="runs/demo-grpo", help="output directory (default runs/demo-grpo)"
    )
    grpo.add_argument("--prompts", type=int, default=8, help="prompts per iteration (default 8)")
    grpo.add_argument("--samples", type=int, default=8, help="completions per prompt, the group size (default 8)")
    grpo.add_argument("--pipelined", action="store_true", help="overlap generation of batch N+1 with training N")
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
    from rl.run_lock import run_lock

    start = time.perf_counter()
    # The lock comes first, before the slow imports and before --fresh deletes anything: a second process is refused
    # at once, and never clears a directory that another one is writing.
    if args.fresh:
        from rl.run_layout import check_fresh

        check_fresh(args.out)  # before the lock, whose files would otherwise land in a folder --fresh refuses
    with run_lock(args.out, command="rl demo grpo"):
        if args.fresh:
            from rl.run_layout import start_fresh

            start_fresh(args.out)
        import asyncio

        from rich.console import Console

        from rl.demo import grpo_demo_config, run_demo
        from rl.errors import CheckpointError

        console = Console(stderr=True)
        config = grpo_demo_config(
            iterations=args.iterations,
            seed=args.seed,
            prompts=args.prompts,
            samples=args.samples,
            pipelined=args.pipelined,
        )
        try:
            summary = asyncio.run(run_demo(config, args.out, console=console, buffer=not args.no_buffer))
        except CheckpointError as exc:
            console.print(f"rl demo grpo: cannot resume the run in {args.out}: {exc}")
            console.print(f"Pass --fresh to start over in {args.out}, or --out another directory.")
            return 2
    summary["wall_s"] = round(time.perf_counter() - start, 2)
    print(
        f"GRPO demo: {summary['iterations']} iterations in {summary['wall_s']} s; training accuracy "
        f"{summary['accuracy_first']:.3f} (first {summary['window']}) -> {summary['accuracy_last']:.3f} "
        f"(last {summary['window']}); best constant answer {summary['constant_baseline_accuracy']:.3f}; "
        f"held-out avg@{config.eval_k} {summary['heldout_avg_at_k_last']:.3f}"
    )
    print(f"report: {summary['report']}\nmetrics: {summary['metrics']}")
    if args.json:
        print(json.dumps(flag_non_finite(summary), allow_nan=False))
    return 0
