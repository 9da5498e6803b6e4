"""Swarm testing: one scenario seed draws its whole fault environment, not just where the faults land.

A fixed mix of every fault at once drowns a rare fault in common ones; a swarm of plans, each with a few kinds on at
their own rates (TigerBeetle's VOPR, FoundationDB's BUGGIFY), reaches corners it does not. `draw_swarm(seed, ...)`
draws, from `seed` alone:

- the run seed (which prompts, which initial weights);
- which fault kinds (`FAULT_KINDS`) are enabled (each on with probability 1/2, exhaustion 1/6) and each one's rate;
- the tasks' retry budgets and the driver's, including budgets a scenario is meant to run out of;
- the latency model's scale and jitter, and the seed that breaks ties among tasks ready at the same instant.

Each fault kind is described beside `FAULT_KINDS`; a loop adds its own. More: docs/chaos.md#swarm-testing.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass, field

from rl.durable.faults import FaultPlan
from rl.seeding import derive_seed

# As `DurableSimulator.fired` counts them: task_failure (an attempt fails before or after its body, within its retries),
# task_hang (an attempt hangs past its timeout, within its retries), driver_crash (the driver killed at an await point,
# at most `max_driver_crashes` a run), torn_checkpoint (killed in the middle of a checkpoint write), exhausted_task (an
# outage fails one action on every attempt: the run fails), exhausted_driver (fewer driver retries than its crashes).
FAULT_KINDS = ("task_failure", "task_hang", "driver_crash", "torn_checkpoint", "exhausted_task", "exhausted_driver")

# Exhaustion ends a run early (its liveness phase runs it again), so each is on in a sixth of scenarios; others half.
ENABLE_P = {"exhausted_task": 1 / 6, "exhausted_driver": 1 / 6}

# Rates each kind may be drawn with: from "rare, one run in a few" to "most actions".
RATES: dict[str, tuple[float, ...]] = {
    "task_failure": (0.02, 0.05, 0.15, 0.3, 0.5),
    "task_hang": (0.02, 0.05, 0.2),
    "driver_crash": (0.01, 0.03, 0.08),
    "torn_checkpoint": (0.05, 0.2, 0.5),
    "exhausted_task": (0.01, 0.03, 0.1, 0.3),
}


@dataclass(frozen=True)
class Swarm:
    """The fault environment of one scenario, drawn from its seed."""

    seed: int
    run_seed: int
    enabled: frozenset[str]
    plan: FaultPlan
    driver_retries: int
    task_retries: dict[str, int] = field(hash=False)
    latency_scale: float
    jitter_scale: float
    tie_break_seed: int
    knobs: dict[str, object] = field(default_factory=dict, hash=False)
    """A loop's own fault settings (the agentic loop's flaky and judge-flake rates, dead trials, scripted crash)."""

    def rates(self) -> dict[str, float]:
        """Each enabled kind's rate (the plan's probability; 1.0 where the kind is a budget, not a rate)."""
        plan = self.plan
        by_kind = {
            "task_failure": plan.task_failure_p,
            "task_hang": plan.task_hang_p,
            "driver_crash": plan.driver_crash_p,
            "torn_checkpoint": plan.torn_checkpoint_p,
            "exhausted_task": plan.exhaust_p,
        }
        return {k: by_kind.get(k, 1.0) for k in sorted(self.enabled)}

    def describe(self) -> list[str]:
        """The scenario, one fact a line, for `rl chaos --trace`."""
        rates = ", ".join(f"{k}={v:g}" for k, v in self.rates().items()) or "none"
        retries = ", ".join(f"{task}={n}" for task, n in sorted(self.task_retries.items()))
        lines = [
            f"scenario seed={self.seed} run_seed={self.run_seed} tie_break_seed={self.tie_break_seed}",
            f"enabled faults: {rates}",
            f"driver retries={self.driver_retries} max_driver_crashes={self.plan.max_driver_crashes}",
            f"task retries: {retries}",
            f"latency: scale={self.latency_scale:g} jitter={self.jitter_scale:g}",
        ]
        if self.knobs:
            lines.append("loop knobs: " + ", ".join(f"{k}={v}" for k, v in sorted(self.knobs.items())))
        return lines


def swarm_rng(loop: str, seed: int) -> random.Random:
    return random.Random(derive_seed("swarm", loop, seed))


def draw_swarm(
    rng: random.Random,
    seed: int,
    *,
    run_seeds: int,
    tasks: dict[str, tuple[int, ...]],
    kinds: Iterable[str] = FAULT_KINDS,
    exhaust_tasks: frozenset[str] = frozenset(),
) -> Swarm:
    """Draw a scenario's environment from `rng` (seeded by `swarm_rng`); `tasks` maps each task to its budgets."""
    enabled = {kind for kind in kinds if rng.random() < ENABLE_P.get(kind, 0.5)}
    rate = {kind: rng.choice(RATES[kind]) if kind in enabled else 0.0 for kind in RATES}
    max_crashes = rng.randint(1, 3)
    if "exhausted_driver" in enabled:
        # Fewer retries than the crashes it may suffer: the driver can die on its last attempt.
        enabled.add("driver_crash")
        rate["driver_crash"] = max(rate["driver_crash"], 0.08)
        driver_retries = rng.randint(0, max_crashes - 1)
    else:
        driver_retries = max_crashes + 1  # every crash the plan allows, plus a spare
    plan = FaultPlan(
        seed=seed,
        task_failure_p=rate["task_failure"],
        task_hang_p=rate["task_hang"],
        driver_crash_p=rate["driver_crash"],
        torn_checkpoint_p=rate["torn_checkpoint"],
        max_driver_crashes=max_crashes,
        exhaust_p=rate["exhausted_task"],
        exhaust_tasks=exhaust_tasks,
    )
    return Swarm(
        seed=seed,
        run_seed=rng.randrange(run_seeds),
        enabled=frozenset(enabled),
        plan=plan,
        driver_retries=driver_retries,
        task_retries={task: rng.choice(budgets) for task, budgets in sorted(tasks.items())},
        latency_scale=rng.choice((0.1, 1.0, 10.0)),
        jitter_scale=rng.choice((0.0, 0.5, 1.0, 4.0)),
        tie_break_seed=rng.randrange(2**31),
    )


def coverage(reports: Iterable[object]) -> dict[str, int]:
    """How many scenarios exercised each fault kind (it fired, not merely was enabled); every kind listed, zeros too."""
    counts: dict[str, int] = {}
    for report in reports:
        for kind in getattr(report, "exercised", ()):
            counts[kind] = counts.get(kind, 0) + 1
    return counts


def trace_summary(sim: object, result_line: str) -> list[str]:
    """The lines after a trace's event log: the faults that fired, where the driver died, and the outcome."""
    fired = getattr(sim, "fired", {})
    events = getattr(sim, "events", [])
    counts = ", ".join(f"{kind} {n}" for kind, n in sorted(fired.items()) if n) or "none"
    crashes = [f"{e.run} d{e.attempt} {e.detail}" for e in events if e.kind == "driver.crash"]
    return [f"faults fired: {counts}", f"crash points: {'; '.join(crashes) or 'none'}", result_line]
