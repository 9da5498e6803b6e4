"""`rl chaos`: seeded fault scenarios and crash-at-every-await-point sweeps of a loop on the durable simulator.

Exit status 0 only when every invariant held. A failure prints its seed and the command that reproduces it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable

from rl.commands import non_negative_int, positive_int
from rl.strict_json import flag_non_finite

LOOPS = ("grpo", "grpo-pipelined", "agentic")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("chaos", help="run seeded fault scenarios on the simulator and check every invariant")
    p.add_argument("--loop", choices=LOOPS, required=True, help="which driver to torture")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--seeds", type=positive_int, default=100, help="run scenarios 0..N-1 (default 100)")
    which.add_argument("--seed", type=non_negative_int, help="rerun exactly one scenario")
    p.add_argument("--no-sweep", action="store_true", help="skip the kill-at-every-await-point sweep")
    p.add_argument("--json", action="store_true", help="end with one JSON object of the results")
    p.set_defaults(func=run)


def _scenario_and_sweep(loop: str) -> tuple[Callable[[int], list[str]], Callable[[], tuple[int, list[str]]]]:
    if loop == "agentic":
        from fakes.chaos_agentic import agentic_scenario, agentic_sweep

        return agentic_scenario, agentic_sweep
    from fakes.chaos import grpo_random, grpo_sweep

    pipelined = loop == "grpo-pipelined"
    check = grpo_random(pipelined)

    def sweep() -> tuple[int, list[str]]:
        reports = grpo_sweep(pipelined)
        return len(reports), [f"kill at await point {r.seed}: {v}" for r in reports for v in r.violations]

    return (lambda seed: check(seed).violations), sweep


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import track

    console = Console(stderr=True)
    scenario, sweep = _scenario_and_sweep(args.loop)
    seeds = [args.seed] if args.seed is not None else list(range(args.seeds))
    failures: list[tuple[int, list[str]]] = []
    start = time.perf_counter()
    for seed in track(seeds, description=f"chaos {args.loop}", console=console, disable=len(seeds) < 2):
        violations = scenario(seed)
        if violations:
            failures.append((seed, violations))
    scenario_s = time.perf_counter() - start
    sweep_points, sweep_violations = (0, []) if args.no_sweep or args.seed is not None else sweep()
    for seed, violations in failures:
        print(f"FAIL seed={seed}: {'; '.join(violations)}")
        print(f"  reproduce: rl chaos --loop {args.loop} --seed {seed}")
    for violation in sweep_violations:
        print(f"FAIL sweep: {violation}")
    if sweep_violations:
        print(f"  reproduce: rl chaos --loop {args.loop} --seeds 0")
    summary = {
        "loop": args.loop,
        "scenarios": len(seeds),
        "failures": len(failures) + len(sweep_violations),
        "scenarios_per_s": round(len(seeds) / scenario_s, 2) if scenario_s > 0 else None,
        "crash_points": sweep_points,
        "seconds": round(time.perf_counter() - start, 2),
    }
    verdict = "ok" if summary["failures"] == 0 else "FAILED"
    print(
        f"chaos {args.loop}: {verdict}: {len(seeds)} random scenarios ({summary['scenarios_per_s']}/s), "
        f"{sweep_points} crash points swept, {summary['failures']} failure(s)"
    )
    if args.json:
        print(json.dumps(flag_non_finite(summary), allow_nan=False))
    sys.stdout.flush()
    return 0 if summary["failures"] == 0 else 1
