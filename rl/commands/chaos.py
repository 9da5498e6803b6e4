"""`rl chaos`: seeded fault scenarios and crash-at-every-await-point sweeps of a loop on the durable simulator.

Exit status 0 only when every invariant held. A failure prints its seed and the command that reproduces it; the run
ends with how many scenarios exercised each fault kind (it fired, not merely was enabled), so coverage is visible.
`--seed S --trace` explains one scenario: its fault environment, the simulator's event log and a final-state digest.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import itertools
import json
import multiprocessing.pool
import sys
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rl.deploy.simulated.chaos import ScenarioReport

from rl.argtypes import non_negative_int, positive_int
from rl.deploy.simulated.scenarios import (
    LOOPS,
    grouped_by_reference,
    scenario_and_sweep,
    scenario_pool,
    scenarios_in_worker,
)
from rl.strict_json import flag_non_finite


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("chaos", help="run seeded fault scenarios on the simulator and check every invariant")
    p.add_argument("--loop", choices=LOOPS, required=True, help="which driver to torture")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--seeds", type=positive_int, default=100, help="run scenarios 0..N-1 (default 100)")
    which.add_argument("--seed", type=non_negative_int, help="rerun exactly one scenario")
    p.add_argument("--no-sweep", action="store_true", help="skip the kill-at-every-await-point sweep")
    p.add_argument(
        "--jobs",
        type=positive_int,
        default=1,
        help="run the random scenarios in N processes (default 1); results and output do not depend on N",
    )
    p.add_argument(
        "--trace",
        action="store_true",
        help="with --seed: print the scenario (enabled faults, rates, budgets), its event log and a final-state digest",
    )
    p.add_argument("--json", action="store_true", help="end with one JSON object of the results")
    p.set_defaults(func=run)


@contextlib.contextmanager
def _pool(jobs: int) -> Iterator[multiprocessing.pool.Pool | None]:
    """Scenarios are independent and seeded, so N processes give the reports one process would, in seed order."""
    if jobs == 1:
        yield None
        return
    with scenario_pool(jobs) as pool:
        yield pool


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import track

    from rl.durable.swarm import coverage

    console = Console(stderr=True)
    if args.trace and args.seed is None:
        print("rl chaos: --trace explains one scenario: give it with --seed S", file=sys.stderr)
        return 2
    scenario, sweep = scenario_and_sweep(args.loop, args.trace)
    seeds = [args.seed] if args.seed is not None else list(range(args.seeds))
    reports: list[ScenarioReport] = []
    start = time.perf_counter()
    with _pool(args.jobs if len(seeds) > 1 else 1) as pool:
        # Seeds sharing a reference run go to one process (`grouped_by_reference`); reports come back in any order
        # and are put back in seed order below, so the output does not depend on --jobs.
        results: Iterator[ScenarioReport] = map(scenario, seeds)
        if pool:
            groups = grouped_by_reference(args.loop, seeds)
            # The agentic loop's references rarely repeat (~1 seed a group): a few groups a message, ~4 per process.
            run = functools.partial(scenarios_in_worker, args.loop)
            chunk = max(1, len(groups) // (4 * args.jobs))
            results = itertools.chain.from_iterable(pool.imap_unordered(run, groups, chunksize=chunk))
        reports.extend(
            track(results, total=len(seeds), description=f"chaos {args.loop}", console=console, disable=len(seeds) < 2)
        )
    reports.sort(key=lambda r: r.seed)  # `seeds` ascend
    failures: list[tuple[int, list[str]]] = [(r.seed, r.violations) for r in reports if r.violations]
    scenario_s = time.perf_counter() - start
    sweep_points, sweep_violations = (0, []) if args.no_sweep or args.seed is not None else sweep()
    for line in reports[0].trace if args.trace else []:
        print(line)
    exercised = coverage(reports)
    exhausted = sum(1 for r in reports if r.error)
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
        "exercised": {kind: exercised.get(kind, 0) for kind in _kinds(args.loop)},
        "exhausted_then_resumed": exhausted,
        "seconds": round(time.perf_counter() - start, 2),
    }
    verdict = "ok" if summary["failures"] == 0 else "FAILED"
    print(
        f"chaos {args.loop}: {verdict}: {len(seeds)} random scenarios ({summary['scenarios_per_s']}/s), "
        f"{sweep_points} crash points swept, {summary['failures']} failure(s)"
    )
    kinds = ", ".join(f"{kind} {n}" for kind, n in summary["exercised"].items())
    print(f"  scenarios exercising each fault kind: {kinds}; {exhausted} exhausted retries, then resumed")
    if args.json:
        print(json.dumps(flag_non_finite(summary), allow_nan=False))
    sys.stdout.flush()
    return 0 if summary["failures"] == 0 else 1


def _kinds(loop: str) -> tuple[str, ...]:
    from rl.durable.swarm import FAULT_KINDS

    if loop == "agentic":
        from rl.deploy.simulated.chaos_agentic import AGENTIC_KINDS, SIM_KINDS

        return SIM_KINDS + AGENTIC_KINDS
    return FAULT_KINDS
