"""Chaos for the agentic loop: seeded fault scenarios and a kill-at-every-await-point sweep, checked against invariants.

`agentic_scenario(seed)` draws one scenario from `seed` — the run's shape, dead trials (sandboxes that die on every
attempt), the seed's flaky-trial and judge-flake rates, a `crash_driver_at_step`, and a `FaultPlan` of task failures
(before or after the body), hung sandboxes and driver crashes — runs it, and returns the violated invariants.
`agentic_sweep()` kills the driver at every await point of the seed's failure-injected run in turn.

The invariants (`check_agentic_run`), each violation a readable sentence:
- the run finishes; every trial is judged or skipped, and only dead trials are skipped;
- the judge is billed exactly once per (trial, rubric) for every judged trial;
- each training step is applied exactly once, on one trainer, which every step reports;
- the history (final weights included) equals the uninterrupted, fault-free run's;
- the parent world never changes, and a trial writes only its own files into its fork.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from typing import Any

from fakes.agentic_sim import AgenticSim, default_inputs
from fakes.durable_sim import RunResult
from fakes.faults import FaultPlan
from fakes.memory_worlds import MemoryWorlds
from rl.agentic.world import ANSWER_FILE, SCRATCH_FILE, world_files
from rl.loop.agentic import AgenticOutcome, trial_specs, world_ids_for
from rl.seeding import derive_seed

SEED_FAILURES: dict[str, Any] = {"flaky_trial_rate": 0.25, "judge_flake_rate": 0.3}
"""The seed's failure-injected run (without its driver crash, which the sweep supplies at every point instead)."""


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
    harness: AgenticSim, result: RunResult, reference: AgenticOutcome, dead_trials: frozenset[str] = frozenset()
) -> list[str]:
    """Every invariant of the agentic loop for one finished run; empty when all hold."""
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
    if len(harness.cluster.trainers) != 1:
        violations.append(f"{len(harness.cluster.trainers)} trainers were created; the run's one should survive")
    identities = sorted({h.actor_pid for h in outcome.history})
    if len(identities) != 1:
        violations.append(f"steps ran on trainer identities {identities}; want one across driver attempts")
    if [h.step for h in outcome.history] != steps:
        violations.append(f"history has steps {[h.step for h in outcome.history]}; want {steps}")
    elif outcome.history != reference.history:
        first = next(i for i, (a, b) in enumerate(zip(outcome.history, reference.history, strict=True)) if a != b)
        violations.append(f"step {first} differs from the uninterrupted run's (weights or summary)")
    violations.extend(_world_violations(harness, inputs["seed"]))
    return violations


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


def _reference(seed: int, dead_trials: frozenset[str], inputs: dict[str, Any]) -> AgenticOutcome:
    clean = {**inputs, "flaky_trial_rate": 0.0, "judge_flake_rate": 0.0, "crash_driver_at_step": -1}
    result = AgenticSim(seed, dead_trials=dead_trials).run(retries=0, **clean)
    if not result.ok:
        raise RuntimeError(f"the fault-free reference run of seed {seed} failed: {result.error!r}")
    assert isinstance(result.output, AgenticOutcome)
    return result.output


def agentic_scenario(seed: int) -> list[str]:
    """Run one seeded random fault scenario; the violated invariants, each with its reason (empty when all hold)."""
    rng = random.Random(derive_seed("agentic-chaos", seed))
    n_steps = rng.randint(1, 3)
    inputs = {
        **default_inputs(seed),
        "n_steps": n_steps,
        "n_worlds": rng.randint(1, 3),
        "prompts_per_step": rng.randint(1, 3),
        "n_samples": rng.randint(1, 2),
    }
    trials = all_trial_ids(inputs)
    dead = frozenset(rng.sample(trials, k=rng.randint(0, min(2, len(trials) - 1))))
    knobs = {
        "flaky_trial_rate": rng.choice([0.0, 0.25, 0.5]),
        "judge_flake_rate": rng.choice([0.0, 0.3, 0.6]),
        "crash_driver_at_step": rng.choice([-1, *range(n_steps)]),
    }
    plan = FaultPlan(
        seed=seed,
        task_failure_p=rng.choice([0.0, 0.1, 0.3]),
        task_hang_p=rng.choice([0.0, 0.1]),
        driver_crash_p=rng.choice([0.0, 0.02, 0.05]),
        max_driver_crashes=3,
    )
    reference = _reference(seed, dead, inputs)
    harness = AgenticSim(seed, plan, dead_trials=dead)
    result = harness.run(retries=plan.max_driver_crashes + 1, **{**inputs, **knobs})
    return check_agentic_run(harness, result, reference, dead)


def agentic_sweep(
    seed: int = 0, *, harness: Callable[..., AgenticSim] = AgenticSim, **shape: int
) -> tuple[int, list[str]]:
    """Kill the driver at every await point of the seed's failure-injected run in turn; (points tried, violations).

    `shape` overrides the seed's 3 steps x 3 worlds x 3 prompts x 2 samples (`n_steps=2, ...`) for a quicker sweep;
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
