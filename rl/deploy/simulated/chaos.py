"""Chaos scenarios: run a loop on the simulator under faults and check every invariant against an uninterrupted run.

Two kinds of scenario per loop:
- a *sweep* kills the driver at each await point of an uninterrupted run in turn, then lets it resume;
- a *random* scenario is a swarm draw (`rl.durable.swarm`): its seed picks the run seed, which fault kinds are on and at
  what rates, the retry budgets, the latency model and the tie-breaking of simultaneous tasks.
  `rl chaos --loop L --seed S [--trace]` reruns (and explains) exactly one.

Safety, then liveness: a scenario whose run finishes must equal the uninterrupted run bit for bit. One whose faults
exhausted a task's retries or the driver's attempts must fail with a `RetriesExhaustedError` naming the task; then the
outage ends and `rerun(recover=True)` must reach the uninterrupted result without executing again any action the
failed run committed (no training step applied twice).
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from rl.deploy.simulated.grpo_sim import (
    EVALUATE,
    GENERATE,
    INIT,
    SCORE,
    TRAIN,
    GrpoSim,
    Latencies,
    grpo_sim,
    lineage_violations,
    outcome_violations,
)
from rl.deploy.simulated.grpo_tiers import LatencyModel
from rl.durable.faults import FaultPlan
from rl.durable.records import RunResult
from rl.durable.swarm import Swarm, draw_swarm, swarm_rng, trace_summary
from rl.durable.virtual_loop import LOOP_PATH
from rl.errors import DriverAttemptsExhausted, InjectedTaskFailure, TaskFailed
from rl.identity import recorded_repr
from rl.loop.grpo import GrpoConfig, GrpoDriver, GrpoOutcome, run_grpo

# The floor: >= 4 iterations of >= 4 groups x 4 samples.
CHAOS_GRPO = GrpoConfig(iterations=4, prompts_per_iteration=4, group_size=4, seed=0)
RUN_SEEDS = 32  # a scenario draws its run seed from 0..RUN_SEEDS-1, so each reference is computed once
GRPO_RETRY_BUDGETS = {GENERATE: (0, 1, 2, 3), SCORE: (0, 1, 2), INIT: (0, 1, 2), TRAIN: (0, 1, 2), EVALUATE: (0, 1, 2)}


@dataclass(frozen=True)
class ScenarioReport:
    loop: str
    seed: int
    violations: list[str]
    crashes: int
    attempts: int
    exercised: frozenset[str] = frozenset()
    """The fault kinds that fired in this scenario (not merely enabled)."""
    error: str = ""
    """The typed error the run failed with, when its faults exhausted retries (the liveness phase then resumed it)."""
    trace: list[str] = field(default_factory=list, compare=False, repr=False)

    @property
    def ok(self) -> bool:
        return not self.violations


def grpo_swarm(seed: int) -> Swarm:
    """The random scenario of `seed`: its fault kinds, rates, retry budgets, latencies and tie-breaking."""
    return draw_swarm(swarm_rng("grpo", seed), seed, run_seeds=RUN_SEEDS, tasks=GRPO_RETRY_BUDGETS)


def swarm_latencies(swarm: Swarm) -> Latencies:
    """The default latencies scaled by the draw; generation stays under its 600 s timeout unless a hang is injected."""
    scale, jitter = swarm.latency_scale, swarm.jitter_scale
    return Latencies(
        generate=LatencyModel(base_s=30.0 * scale, per_item_s=1.0 * scale, jitter_s=30.0 * jitter * min(scale, 1.0)),
        score=LatencyModel(base_s=0.5 * scale, jitter_s=0.5 * jitter),
        train=LatencyModel(base_s=20.0 * scale, per_item_s=0.5 * scale),
        evaluate=LatencyModel(base_s=10.0 * scale, jitter_s=5.0 * jitter),
        train_cold_start_s=30.0 * scale if jitter > 1.0 else 0.0,
    )


def exhaustion_violations(error: BaseException, enabled: frozenset[str], outage: str = "injected outage") -> list[str]:
    """A failed run is allowed only as the typed failure of a fault meant to exhaust retries, naming its task."""
    if isinstance(error, TaskFailed):
        if "exhausted_task" not in enabled:
            return [f"the run failed although no enabled fault exhausts a task's retries: {error}"]
        if not (isinstance(error.cause, InjectedTaskFailure) and outage in str(error.cause)):
            return [f"task {error.task} failed of its own, not from the injected outage: {error.cause!r}"]
        if error.task not in str(error):
            return [f"the run's error does not name the task that ran out of retries: {error}"]
        return []
    if isinstance(error, DriverAttemptsExhausted):
        if not enabled & {"exhausted_driver", "exhausted_task"}:  # a task's outage spends driver attempts too
            return [f"the driver ran out of attempts although its retries covered every allowed crash: {error}"]
        return []
    return [f"the run failed with {type(error).__name__}, not a RetriesExhaustedError naming the task: {error}"]


def resume_violations(sim_events: list, failed: RunResult, resumed: RunResult, committed: set[str]) -> list[str]:
    """Liveness after exhaustion: the resumed run finishes and executes no action the failed run had committed."""
    if not resumed.ok:
        return [f"the resume after {type(failed.error).__name__} did not finish: {resumed.error!r}"]
    again = sorted(
        {(e.task, e.action) for e in sim_events if e.run == resumed.run_id and e.kind == "action.start"}
        & {(e.task, e.action) for e in sim_events if e.action in committed}
    )
    return [f"{task} ({action}) was committed by the failed run but executed again on resume" for task, action in again]


def state_digest(outcome: GrpoOutcome) -> str:
    """A short digest of a finished run's state (adapter, optimizer, history, evals) to compare two runs by eye."""
    rows = ", ".join(recorded_repr(replace(row, phase_s={})) for row in outcome.history)
    text = f"({outcome.adapter.digest!r}, {outcome.optimizer_state.digest!r}, [{rows}], {outcome.evals!r})"
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


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


def _grpo_swarm_check(
    loop: str, pipelined: bool, swarm: Swarm, driver: GrpoDriver, base: GrpoConfig, trace: bool, loop_path: str
) -> ScenarioReport:
    config = _grpo_config(pipelined, swarm.run_seed, base)
    setup: GrpoSim = grpo_sim(
        config,
        seed=swarm.run_seed,
        faults=swarm.plan,
        latencies=swarm_latencies(swarm),
        driver=driver,
        retries=swarm.task_retries,
        tie_break_seed=swarm.tie_break_seed,
        loop_path=loop_path,
    )
    sim = setup.sim
    result = setup.run(retries=swarm.driver_retries)
    reference = _grpo_reference(pipelined, swarm.run_seed, driver, base)
    final, error = result, ""
    if result.ok:
        violations = outcome_violations(reference, result.output) + lineage_violations(config, setup, result.output)
    else:
        assert result.error is not None
        error = f"{type(result.error).__name__}: {result.error}"
        violations = exhaustion_violations(result.error, swarm.enabled)
        committed = set(sim.journal(result.run_id))
        sim.faults = swarm.plan.outage_over()
        final = sim.rerun(result, driver=setup.driver, recover=True, retries=swarm.plan.max_driver_crashes + 1)
        violations += resume_violations(sim.events, result, final, committed)
        if final.ok:
            violations += outcome_violations(reference, final.output)
            violations += lineage_violations(config, setup, final.output)
    lines: list[str] = []
    if trace:
        lines = [*swarm.describe(), "event log:", *sim.log_lines()]
        outcome = "ok" if final.ok else f"FAILED {final.error!r}"
        first = f" after the first run failed with {error}" if error else ""
        lines += trace_summary(sim, f"result: {outcome}{first}")
        if final.ok:
            lines.append(f"final state digest: {state_digest(final.output)} (reference {state_digest(reference)})")
    exercised = frozenset(kind for kind, n in sim.fired.items() if n)
    return ScenarioReport(
        loop, swarm.seed, violations, sim_crashes(result, final), final.attempts, exercised, error, lines
    )


def sim_crashes(first: RunResult, final: RunResult) -> int:
    return first.crashes + (final.crashes if final is not first else 0)


def grpo_random(
    pipelined: bool,
    *,
    driver: GrpoDriver = run_grpo,
    config: GrpoConfig = CHAOS_GRPO,
    trace: bool = False,
    loop_path: str = LOOP_PATH,
) -> Callable[[int], ScenarioReport]:
    """The swarm scenario of a seed, its invariants checked (`trace=True`: the report carries the scenario's trace)."""
    loop = "grpo-pipelined" if pipelined else "grpo"
    return lambda seed: _grpo_swarm_check(loop, pipelined, grpo_swarm(seed), driver, config, trace, loop_path)


def grpo_sweep(
    pipelined: bool, *, driver: GrpoDriver = run_grpo, config: GrpoConfig = CHAOS_GRPO, run_seed: int = 0
) -> list[ScenarioReport]:
    """Kill the driver at each await point of the uninterrupted run in turn."""
    loop = "grpo-pipelined" if pipelined else "grpo"
    points = grpo_sim(_grpo_config(pipelined, run_seed, config), seed=run_seed, driver=driver).run().await_points
    return [_grpo_check(loop, pipelined, point, run_seed, None, point, driver, config) for point in range(points)]
