"""Chaos for the agentic loop: seeded fault scenarios and a kill-at-every-await-point sweep, checked against invariants.

`agentic_scenario(seed)` draws one swarm scenario from `seed` (`rl.durable.swarm`: the run's shape, which fault kinds
are on and their rates, the retry budgets, the latencies, the tie-breaking), runs it, and returns the violated
invariants. A run that exhausted retries must fail naming the task; `rerun(recover=True)` must then reach the
uninterrupted result without executing again any action the failed run committed. `agentic_sweep()` kills the driver at
every await point of the tutorial's failure-injected run in turn.

The invariants (`check_agentic_run`), each violation a readable sentence: the run finishes, skipping only dead trials;
the judge is billed once per (trial, rubric); each step is applied exactly once, on one trainer; the history equals
the uninterrupted, fault-free run's; the parent world never changes. In full: docs/chaos.md#the-agentic-scenarios.
"""

from __future__ import annotations

import functools
import hashlib
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from rl.agentic.world import ANSWER_FILE, SCRATCH_FILE, world_files
from rl.deploy.simulated.agentic_sim import BUILD_WORLD, GENERATE, JUDGE, SETUP, TRAIN_STEP, AgenticSim, default_inputs
from rl.deploy.simulated.chaos import ScenarioReport, exhaustion_violations
from rl.deploy.simulated.worlds import MemoryWorlds
from rl.durable.records import RunResult
from rl.durable.swarm import FAULT_KINDS, Swarm, draw_swarm, swarm_rng, trace_summary
from rl.durable.virtual_loop import LOOP_PATH
from rl.loop.agentic import AgenticOutcome, trial_specs, world_ids_for

SEED_FAILURES: dict[str, Any] = {"flaky_trial_rate": 0.25, "judge_flake_rate": 0.3}
"""The tutorial's failure-injected run (without its driver crash, which the sweep supplies at every point instead)."""


def all_trial_ids(inputs: dict[str, Any]) -> list[str]:
    world_ids = world_ids_for(inputs["n_worlds"])
    return [
        spec.trial_id
        for step in range(inputs["n_steps"])
        for spec in trial_specs(
            step,
            world_ids,
            inputs["prompts_per_step"],
            inputs["n_samples"],
            seed=inputs["seed"],
            max_turns=inputs["max_turns"],
        )
    ]


def check_agentic_run(
    harness: AgenticSim,
    result: RunResult,
    reference: AgenticOutcome,
    dead_trials: frozenset[str] = frozenset(),
    *,
    resumed: bool = False,
) -> list[str]:
    """Every invariant of the agentic loop for one finished run; empty when all hold.

    `resumed`: the run is a `rerun(recover=True)` of a failed one, whose trainer and judge bills count too.
    """
    if not result.ok:
        return [f"the run did not finish: {type(result.error).__name__}: {result.error}"]
    inputs, outcome = result.inputs, result.output
    assert isinstance(outcome, AgenticOutcome)
    violations: list[str] = []
    trials = all_trial_ids(inputs)
    per_step = inputs["prompts_per_step"] * inputs["n_samples"]
    skipped = {s.trial_id for s in outcome.skipped}
    for trial_id in sorted(skipped - dead_trials):
        violations.append(f"trial {trial_id} was skipped although it only failed within its retries")
    for trial_id in sorted((dead_trials & set(trials)) - skipped):
        violations.append(f"trial {trial_id} always fails but was not counted as skipped")
    for h in outcome.history:
        lost = sum(1 for s in outcome.skipped if s.trial_id.startswith(f"s{h.step}-"))
        if h.n_trials + lost != per_step:
            violations.append(f"step {h.step}: {h.n_trials} judged + {lost} skipped != {per_step} trials")

    rubric = inputs["rubric"].name
    judged = [t for t in trials if t not in dead_trials]
    for trial_id in judged:
        billed = harness.judge.billed[(trial_id, rubric)]
        if billed != 1:
            violations.append(f"judge billed {billed} times for ({trial_id}, {rubric}); want exactly once")

    trainer = harness.trainer_of(result)
    steps = list(range(inputs["n_steps"]))
    if trainer is None:
        violations.append("no trainer was ever attached in this run")
    else:
        # A fork's trainer may not count its applications; its weights still tell (the history check below).
        applications: Counter[int] | None = getattr(trainer, "applications", None)
        if applications is not None:
            for step in steps:
                if applications[step] != 1:
                    violations.append(f"training step {step} applied {applications[step]} times; want once")
    if not resumed and len(harness.cluster.trainers) != 1:
        violations.append(f"{len(harness.cluster.trainers)} trainers were created; the run's one should survive")
    identities = sorted({h.actor_pid for h in outcome.history})
    if len(identities) != 1:
        violations.append(f"steps ran on trainer identities {identities}; want one across driver attempts")
    if [h.step for h in outcome.history] != steps:
        violations.append(f"history has steps {[h.step for h in outcome.history]}; want {steps}")
    elif _pidless(outcome.history, resumed) != _pidless(reference.history, resumed):
        first = next(i for i, (a, b) in enumerate(zip(outcome.history, reference.history, strict=True)) if a != b)
        violations.append(f"step {first} differs from the uninterrupted run's (weights or summary)")
    violations.extend(_world_violations(harness, inputs["seed"]))
    return violations


def _pidless(history: list[Any], resumed: bool) -> list[Any]:
    """A fresh run after a failed one trains on its own trainer, a new process: only its pid may differ."""
    return [h.model_copy(update={"actor_pid": 0}) for h in history] if resumed else history


def _world_violations(harness: AgenticSim, seed: int) -> list[str]:
    worlds = harness.worlds
    if not isinstance(worlds, MemoryWorlds):
        return []
    violations: list[str] = []
    for name, fork in sorted(worlds.forks.items()):
        parent_name = worlds.names[fork.parent]
        world_id = parent_name.split("-")[1]
        if worlds.read(fork.parent) != world_files(seed, world_id):
            violations.append(f"parent world {parent_name} changed after trial fork {name} wrote into its copy")
        stray = sorted(set(fork.written()) - {ANSWER_FILE, SCRATCH_FILE})
        if stray:
            violations.append(f"fork {name} wrote {stray}; a trial writes only its answer and scratch files")
    return violations


SHAPE = ("n_steps", "n_worlds", "prompts_per_step", "n_samples")
RUN_SEEDS = 16
"""A scenario draws its run seed from 0..RUN_SEEDS-1, so fault-free references repeat and are computed once each."""


@functools.lru_cache(maxsize=4096)
def _cached_reference(seed: int, dead_trials: frozenset[str], shape: tuple[int, ...]) -> AgenticOutcome:
    return _reference(seed, dead_trials, {**default_inputs(seed), **dict(zip(SHAPE, shape, strict=True))})


def _reference(seed: int, dead_trials: frozenset[str], inputs: dict[str, Any]) -> AgenticOutcome:
    clean = {**inputs, "flaky_trial_rate": 0.0, "judge_flake_rate": 0.0, "crash_driver_at_step": -1}
    result = AgenticSim(seed, dead_trials=dead_trials).run(retries=0, **clean)
    if not result.ok:
        raise RuntimeError(f"the fault-free reference run of seed {seed} failed: {result.error!r}")
    assert isinstance(result.output, AgenticOutcome)
    return result.output


AGENTIC_KINDS = ("dead_trial", "flaky_trial", "judge_flake", "crash_at_step")
SIM_KINDS = tuple(kind for kind in FAULT_KINDS if kind != "torn_checkpoint")
"""The agentic driver keeps no checkpoint (its trainer holds the state), so a torn checkpoint write cannot happen."""
AGENTIC_RETRY_BUDGETS = {
    BUILD_WORLD: (0, 1),
    GENERATE: (1, 2, 3),
    JUDGE: (1, 2, 3),
    SETUP: (0, 1),
    TRAIN_STEP: (0, 1, 2),
}
"""Generate and judge keep >= 1 retry: the tutorial's flaky sandboxes and judges fail attempt 0, and must be
survivable."""
EXHAUSTIBLE = frozenset({SETUP, TRAIN_STEP})
"""A generate or judge that exhausts its retries skips its trial by design (a dead trial); these tasks fail the run."""


def agentic_swarm(seed: int) -> tuple[Swarm, dict[str, Any], frozenset[str]]:
    """The scenario of `seed`: its swarm draw (the loop's knobs in `knobs`), the run's inputs and its dead trials."""
    rng = swarm_rng("agentic", seed)
    swarm = draw_swarm(
        rng, seed, run_seeds=RUN_SEEDS, tasks=AGENTIC_RETRY_BUDGETS, kinds=SIM_KINDS, exhaust_tasks=EXHAUSTIBLE
    )
    n_steps = rng.randint(1, 3)
    inputs = {
        **default_inputs(swarm.run_seed),
        "n_steps": n_steps,
        "n_worlds": rng.randint(1, 3),
        "prompts_per_step": rng.randint(1, 3),
        "n_samples": rng.randint(1, 2),
    }
    own = {kind for kind in AGENTIC_KINDS if rng.random() < 0.5}
    trials = all_trial_ids(inputs)
    if len(trials) < 2:
        own.discard("dead_trial")  # a step of dead trials only has nothing to train on
    dead = (
        frozenset(rng.sample(trials, k=rng.randint(1, min(2, len(trials) - 1)))) if "dead_trial" in own else frozenset()
    )
    knobs: dict[str, object] = {
        "flaky_trial_rate": rng.choice([0.25, 0.5]) if "flaky_trial" in own else 0.0,
        "judge_flake_rate": rng.choice([0.3, 0.6]) if "judge_flake" in own else 0.0,
        "crash_driver_at_step": rng.randrange(n_steps) if "crash_at_step" in own else -1,
    }
    if dead:
        knobs["dead_trials"] = ",".join(sorted(dead))
    return replace(swarm, enabled=swarm.enabled | own, knobs=knobs), inputs, dead


def reference_key(
    swarm: Swarm, inputs: dict[str, Any], dead: frozenset[str]
) -> tuple[int, frozenset[str], tuple[int, ...]]:
    """What scenario `agentic_swarm(seed)`'s uninterrupted reference run depends on: `_cached_reference`'s arguments
    (`rl.deploy.simulated.scenarios.grouped_by_reference` groups seeds by it)."""
    return swarm.run_seed, dead, tuple(inputs[k] for k in SHAPE)


def agentic_report(seed: int, *, trace: bool = False, loop_path: str = LOOP_PATH) -> ScenarioReport:
    """Run one seeded swarm scenario and check every invariant (safety, then liveness after an exhausted run);
    `loop_path`: which iteration the virtual loop runs (`rl.durable.virtual_loop.loop_path`)."""
    swarm, inputs, dead = agentic_swarm(seed)
    scale = swarm.latency_scale
    run_seed = swarm.run_seed
    if "crash_at_step" in swarm.enabled and swarm.driver_retries == 0:
        swarm = replace(swarm, driver_retries=1)  # the scripted crash needs a second attempt to be a crash, not an end
    knobs = {k: v for k, v in swarm.knobs.items() if k != "dead_trials"}
    reference = _cached_reference(*reference_key(swarm, inputs, dead))
    jitter = swarm.jitter_scale

    def trial_delay_s(trial_id: str) -> float:
        return 5.0 * jitter * int.from_bytes(hashlib.blake2b(trial_id.encode(), digest_size=2).digest(), "big") / 65536

    harness = AgenticSim(
        run_seed,
        swarm.plan,
        dead_trials=dead,
        tool_latency_s=0.2 * scale,
        judge_latency_s=0.5 * scale,
        trial_delay_s=trial_delay_s if jitter else None,
        retries=swarm.task_retries,
        tie_break_seed=swarm.tie_break_seed,
        loop_path=loop_path,
    )
    sim = harness.sim
    result = harness.run(retries=swarm.driver_retries, **{**inputs, **knobs})
    final, error = result, ""
    if result.ok:
        violations = check_agentic_run(harness, result, reference, dead)
    else:
        assert result.error is not None
        error = f"{type(result.error).__name__}: {result.error}"
        violations = exhaustion_violations(result.error, swarm.enabled)
        # The documented resume is a fresh run: the trainer is run-scoped (the tutorial's ReusePolicy(scope="run")), so
        # a rerun(recover=True) would replay committed train steps onto a new trainer that never applied them (it fails
        # with StepOutOfOrderError). A fresh run must still reach the uninterrupted result, billing each trial once.
        sim.faults = swarm.plan.outage_over()
        harness.judge.billed.clear()  # the failed run's bills are its own; the fresh run's are checked
        final = harness.sim.rerun(
            result, driver=harness.driver, recover=False, retries=swarm.plan.max_driver_crashes + 2
        )
        if not final.ok:
            violations.append(f"the fresh run after {type(result.error).__name__} did not finish: {final.error!r}")
        else:
            violations += check_agentic_run(harness, final, reference, dead, resumed=True)
    exercised = {kind for kind, n in sim.fired.items() if n}
    exercised |= {k for k in swarm.enabled if k in AGENTIC_KINDS}
    lines: list[str] = []
    if trace:
        lines = [*swarm.describe(), f"shape: {_shape(inputs)}", "event log:", *sim.log_lines()]
        outcome = "ok" if final.ok else f"FAILED {final.error!r}"
        first = f" after the first run failed with {error}" if error else ""
        lines += trace_summary(sim, f"result: {outcome}{first}")
        if final.ok:
            lines.append(f"final state digest: {agentic_digest(final.output)} (reference {agentic_digest(reference)})")
    crashes = result.crashes + (final.crashes if final is not result else 0)
    return ScenarioReport("agentic", seed, violations, crashes, final.attempts, frozenset(exercised), error, lines)


def _shape(inputs: dict[str, Any]) -> str:
    return ", ".join(f"{k}={inputs[k]}" for k in SHAPE)


def agentic_digest(outcome: AgenticOutcome) -> str:
    """A short digest of a finished agentic run (history with final weights, skipped trials) to compare by eye."""
    text = repr((outcome.history, sorted(s.trial_id for s in outcome.skipped)))
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def agentic_scenario(seed: int) -> list[str]:
    """Run one seeded swarm scenario; the violated invariants, each with its reason (empty when all hold)."""
    return agentic_report(seed).violations


def agentic_sweep(
    seed: int = 0, *, harness: Callable[..., AgenticSim] = AgenticSim, **shape: int
) -> tuple[int, list[str]]:
    """Kill the driver at every await point of the tutorial's failure-injected run in turn; (points tried, violations).

    `shape` overrides the tutorial's 3 steps x 3 worlds x 3 prompts x 2 samples (`n_steps=2, ...`) for a quicker sweep;
    `harness(seed)` builds each run's `AgenticSim` (a fork's driver, judge tier or trainer bound in, under conformance).
    """
    unknown = set(shape) - {"n_steps", "n_worlds", "prompts_per_step", "n_samples"}
    if unknown:
        raise TypeError(
            f"agentic_sweep shapes only n_steps, n_worlds, prompts_per_step, n_samples; got {sorted(unknown)}"
        )
    inputs = {**default_inputs(seed), **SEED_FAILURES, **shape}
    clean = harness(seed).run(retries=0, **inputs)
    if not clean.ok:
        return 0, [f"the uninterrupted run failed: {clean.error!r}"]
    assert isinstance(clean.output, AgenticOutcome)
    violations: list[str] = []
    for point in range(clean.await_points):
        sim = harness(seed)
        result = sim.run(retries=1, crash_at=point, **inputs)
        found = check_agentic_run(sim, result, clean.output)
        if result.crashes != 1:
            found.append(f"the driver crashed {result.crashes} times; want exactly the injected one")
        violations.extend(f"crash_at={point}: {v}" for v in found)
    return clean.await_points, violations
