"""`rl demo agentic`: the agentic tutorial's durable loop on the simulator, printing the tutorial's failure
table.

`rl demo` is shared with the GRPO demo, so this module does not register a top-level command: the `demo` command calls
`add_agentic_demo(demo_subparsers)`. Heavy imports (the simulator, rich) happen inside the handler.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from typing import Any

from rl.argtypes import int_at_least, positive_int
from rl.strict_json import flag_non_finite


def add_agentic_demo(demo_subparsers: Any) -> argparse.ArgumentParser:
    """Register `agentic` under `rl demo`; returns its parser."""
    parser: argparse.ArgumentParser = demo_subparsers.add_parser(
        "agentic",
        help="the durable agentic RL loop (the agentic tutorial) on the simulator, with its failure table",
        description=(
            "Run the agentic tutorial's loop (forked worlds, sandboxed trials, verifier + memoised judge, exactly-once "
            "bandit trainer) on the deterministic durable-execution simulator and print the tutorial's failure table. "
            "The tutorial's failure-injected run: "
            "--crash-driver-at-step 1 --flaky-trial-rate 0.25 --judge-flake-rate 0.3"
        ),
    )
    parser.add_argument("--steps", type=positive_int, default=3, help="training steps (default 3)")
    parser.add_argument(
        "--worlds", type=positive_int, default=3, help="worlds; prompt p explores world p mod W (default 3)"
    )
    parser.add_argument("--prompts-per-step", type=positive_int, default=3, help="prompts per step (default 3)")
    parser.add_argument("--samples", type=positive_int, default=2, help="trials per prompt (default 2)")
    parser.add_argument(
        "--crash-driver-at-step",
        type=int_at_least(-1),
        default=-1,
        metavar="K",
        help="kill driver attempt 0 after step K, one of 0..steps-1 (default -1: no crash)",
    )
    parser.add_argument(
        "--flaky-trial-rate", type=float, default=0.0, metavar="P", help="sandboxes that die on attempt 0"
    )
    parser.add_argument(
        "--judge-flake-rate", type=float, default=0.0, metavar="Q", help="judge tasks failing after the judge call"
    )
    parser.add_argument("--seed", type=int, default=0, help="the one seed every draw and fault derives from")
    parser.add_argument("--json", action="store_true", help="end with one JSON line of the table's counts")
    parser.set_defaults(func=run_agentic_demo)
    return parser


def check_agentic_args(args: argparse.Namespace) -> None:
    """Refuse flags that cannot work together (each flag's own range is refused by argparse), before the run."""
    from rl.errors import InputError

    for flag, value in (("--flaky-trial-rate", args.flaky_trial_rate), ("--judge-flake-rate", args.judge_flake_rate)):
        if not 0.0 <= value <= 1.0:
            raise InputError(f"{flag} must be a probability in [0, 1], got {value}")
    if args.crash_driver_at_step >= args.steps:
        raise InputError(
            f"--crash-driver-at-step {args.crash_driver_at_step} is beyond the run's {args.steps} steps (0.."
            f"{args.steps - 1}): pass a step in that range, or -1 for no crash"
        )


def _arrow(values: list[float]) -> str:
    return " → ".join(f"{v:g}" for v in values) or "-"


def run_agentic_demo(args: argparse.Namespace) -> int:
    """Run the demo; exit status 0 when the run finished."""
    from rich.console import Console
    from rich.table import Table

    from rl.deploy.simulated.agentic_sim import AgenticSim

    check_agentic_args(args)
    console = Console(highlight=False)
    harness = AgenticSim(seed=args.seed)
    inputs = {
        "n_steps": args.steps,
        "n_worlds": args.worlds,
        "prompts_per_step": args.prompts_per_step,
        "n_samples": args.samples,
        "crash_driver_at_step": args.crash_driver_at_step,
        "flaky_trial_rate": args.flaky_trial_rate,
        "judge_flake_rate": args.judge_flake_rate,
    }
    retries = 1 if 0 <= args.crash_driver_at_step < args.steps else 0
    result = harness.run(retries=retries, **inputs)
    t = harness.report(result)

    table = Table(title=f"agentic RL, failure-injected (seed={args.seed})")
    table.add_column("")
    table.add_column("count", justify="right")
    table.add_column("note")
    table.add_row(
        "generate succeeded / retried",
        f"{t.generate_succeeded} / {t.trial_retries}",
        f"{t.trial_retries} sandbox failures retried; {t.trials_skipped} trials skipped after their retries",
    )
    table.add_row(
        "verify_and_judge succeeded / retried",
        f"{t.judge_succeeded} / {t.judge_retries}",
        f"judge called {t.judge_calls} times for {t.trials_completed} trials; {t.judge_replays} retries replayed it",
    )
    trainers = ", ".join(str(i) for i in t.trainer_ids) or "-"
    table.add_row("train_step", str(t.train_steps), f"trainer identity {trainers}; {t.train_steps_replayed} replayed")
    k = args.crash_driver_at_step
    crash = "no crash injected"
    if retries:
        crash = f"crashed after step {k}; attempt 2 replayed steps 0–{k} and ran the rest"
    table.add_row("driver", f"{t.driver_attempts} attempts", crash)
    turns, rewards = t.mean_turns_by_step, t.mean_reward_by_step
    learned = len(turns) > 1 and turns[-1] < turns[0]
    table.add_row("learning", "✓" if learned else "✗", f"mean turns {_arrow(turns)}; mean reward {_arrow(rewards)}")
    console.print(table)
    if not t.ok:
        console.print(f"run failed: {t.error}")
    console.print(
        f"seed={args.seed}  reproduce: rl demo agentic --steps {args.steps} --worlds {args.worlds} "
        f"--prompts-per-step {args.prompts_per_step} --samples {args.samples} "
        f"--crash-driver-at-step {args.crash_driver_at_step} --flaky-trial-rate {args.flaky_trial_rate} "
        f"--judge-flake-rate {args.judge_flake_rate} --seed {args.seed}",
        soft_wrap=True,
    )
    if args.json:
        print(
            json.dumps(flag_non_finite({"seed": args.seed, **asdict(t)}), sort_keys=True, allow_nan=False), flush=True
        )
    return 0 if t.ok else 1
