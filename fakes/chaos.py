"""Chaos scenarios: run a loop on the simulator under faults and check every invariant against an uninterrupted run.

Two kinds of scenario per loop:
- a *sweep* kills the driver at each await point of an uninterrupted run in turn, then lets it resume;
- a *random* scenario follows a `FaultPlan` drawn from one integer seed (task failures, hangs, driver crashes, torn
  checkpoint writes). `rl chaos --loop L --seed S` reruns exactly one.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, replace

from fakes.faults import FaultPlan
from fakes.grpo_sim import GrpoDriver, grpo_sim, lineage_violations, outcome_violations
from rl.loop.grpo import GrpoConfig, GrpoOutcome, run_grpo

# The floor: >= 4 iterations of >= 4 groups x 4 samples.
CHAOS_GRPO = GrpoConfig(iterations=4, prompts_per_iteration=4, group_size=4, seed=0)
RUN_SEEDS = 8  # scenario seed S trains with run seed S % RUN_SEEDS, so references are computed once each


@dataclass(frozen=True)
class ScenarioReport:
    loop: str
    seed: int
    violations: list[str]
    crashes: int
    attempts: int

    @property
    def ok(self) -> bool:
        return not self.violations


def fault_plan(seed: int) -> FaultPlan:
    """The random scenario of `seed`: every fault kind at once, with rates high enough to hit every run."""
    return FaultPlan(
        seed=seed,
        task_failure_p=0.15,
        task_hang_p=0.05,
        driver_crash_p=0.04,
        torn_checkpoint_p=0.1,
        max_driver_crashes=3,
    )


def _grpo_config(pipelined: bool, run_seed: int, base: GrpoConfig = CHAOS_GRPO) -> GrpoConfig:
    return replace(base, pipelined=pipelined, seed=run_seed)


@functools.cache
def _grpo_reference(
    pipelined: bool, run_seed: int, driver: GrpoDriver = run_grpo, base: GrpoConfig = CHAOS_GRPO
) -> GrpoOutcome:
    result = grpo_sim(_grpo_config(pipelined, run_seed, base), seed=run_seed, driver=driver).run()
    if not result.ok:
        raise RuntimeError(f"the uninterrupted reference run failed: {result.error!r}")
    return result.output


def _grpo_check(
    loop: str,
    pipelined: bool,
    seed: int,
    run_seed: int,
    faults: FaultPlan | None,
    crash_at: int | None,
    driver: GrpoDriver = run_grpo,
    base: GrpoConfig = CHAOS_GRPO,
) -> ScenarioReport:
    config = _grpo_config(pipelined, run_seed, base)
    setup = grpo_sim(config, seed=run_seed, faults=faults, driver=driver)
    result = setup.run(retries=(faults.max_driver_crashes if faults else 0) + 1, crash_at=crash_at)
    if not result.ok:
        violations = [f"run did not finish: {result.error!r}"]
    else:
        violations = outcome_violations(_grpo_reference(pipelined, run_seed, driver, base), result.output)
        violations += lineage_violations(config, setup, result.output)
    if crash_at is not None and result.crashes < 1:
        violations.append(f"the driver was never killed at await point {crash_at}")
    return ScenarioReport(loop, seed, violations, result.crashes, result.attempts)


def grpo_random(
    pipelined: bool, *, driver: GrpoDriver = run_grpo, config: GrpoConfig = CHAOS_GRPO
) -> Callable[[int], ScenarioReport]:
    loop = "grpo-pipelined" if pipelined else "grpo"
    return lambda seed: _grpo_check(loop, pipelined, seed, seed % RUN_SEEDS, fault_plan(seed), None, driver, config)


def grpo_sweep(
    pipelined: bool, *, driver: GrpoDriver = run_grpo, config: GrpoConfig = CHAOS_GRPO, run_seed: int = 0
) -> list[ScenarioReport]:
    """Kill the driver at each await point of the uninterrupted run in turn."""
    loop = "grpo-pipelined" if pipelined else "grpo"
    points = grpo_sim(_grpo_config(pipelined, run_seed, config), seed=run_seed, driver=driver).run().await_points
    return [_grpo_check(loop, pipelined, point, run_seed, None, point, driver, config) for point in range(points)]
