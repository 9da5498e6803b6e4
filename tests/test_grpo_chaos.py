"""Crash-and-resume chaos for the GRPO driver on the simulator: every invariant holds wherever the driver dies."""

from __future__ import annotations

import pytest

from rl.deploy.simulated.chaos import grpo_random, grpo_swarm, grpo_sweep


@pytest.mark.heavy  # ~70 crash-and-resume runs, ~1 CPU-s; unit keeps the driver law (test_conformance_ours.py)
@pytest.mark.parametrize("pipelined", [False, True])
def test_killing_the_driver_at_every_await_point_resumes_to_the_uninterrupted_result(pipelined):
    """docs/guarantees.md: "Killing the driver at any await point and resuming gives the uninterrupted run's adapter,
    optimizer state and history, bitwise; no prompt is trained twice or skipped; no adapter version is missing or
    repeated"."""
    reports = grpo_sweep(pipelined)
    assert len(reports) > 60  # 4 iterations x 4 groups: every call, return and checkpoint is a point
    assert all(r.crashes == 1 and r.attempts == 2 for r in reports)
    assert [f"point {r.seed}: {v}" for r in reports for v in r.violations] == []


@pytest.mark.parametrize("pipelined", [False, True])
def test_seeded_random_fault_scenarios_keep_every_invariant(pipelined):
    """Task failures before and after side effects, hangs past timeouts, driver crashes and torn checkpoint writes."""
    check = grpo_random(pipelined)
    reports = [check(seed) for seed in range(16)]
    assert sum(r.crashes for r in reports) > 0  # the plans really killed drivers
    assert [(r.seed, r.violations) for r in reports if r.violations] == []


def test_a_scenario_is_reproducible_from_its_seed():
    """docs/guarantees.md: "Every crash point and fault schedule is reproducible from one integer seed"."""
    check = grpo_random(pipelined=True)
    assert check(5) == check(5)
    assert grpo_swarm(5) == grpo_swarm(5) != grpo_swarm(6)


@pytest.mark.heavy  # a whole sweep, ~0.7 CPU-s
def test_a_broken_driver_is_caught_by_the_sweep(monkeypatch):
    """The invariants can fail: a driver that forgets the optimizer state on resume diverges from the reference."""
    import rl.loop.grpo as grpo

    real_load = grpo.load_state

    async def forgetful_load(store, config, artifacts):
        state = await real_load(store, config, artifacts)
        if state is None or state.iteration < 0:
            return state
        from dataclasses import replace

        return replace(state, history=state.history[:-1])  # drops the last row on resume

    monkeypatch.setattr(grpo, "load_state", forgetful_load)
    reports = grpo_sweep(pipelined=False)
    assert any(r.violations for r in reports)


@pytest.mark.parametrize("pipelined", [False, True])
def test_the_direct_binding_reaches_the_simulated_runs_outcome_without_issuing_a_task(pipelined):
    """`grpo_sim(tasks=False)`, `rl bench`'s floor: the same driver on the same in-memory tiers, called directly, ends
    where the simulated run ends (a fault-free run's outcome does not depend on the task semantics), and issues no
    action."""
    from dataclasses import replace

    from rl.deploy.simulated.chaos import CHAOS_GRPO
    from rl.deploy.simulated.grpo_sim import grpo_sim, outcome_violations

    config = replace(CHAOS_GRPO, pipelined=pipelined, seed=5)
    simulated = grpo_sim(config, seed=5).run()
    setup = grpo_sim(config, seed=5, tasks=False)
    direct = setup.run()
    assert simulated.ok and direct.ok
    assert outcome_violations(simulated.output, direct.output) == []
    assert direct.history == () and setup.sim.count("action.start") == 0
    assert simulated.virtual_time_s == direct.virtual_time_s


def test_the_simulator_floor_times_both_bindings_and_refuses_runs_that_disagree(monkeypatch):
    import rl.bench.sim as bench

    figures = bench.simulator_floor(runs=2, repeats=2)
    assert figures["grpo_run_ms"] > 0 and figures["grpo_direct_run_ms"] > 0 and figures["grpo_direct_share"] > 0
    monkeypatch.setattr(bench, "outcome_violations", lambda reference, outcome: ["final adapter differs"])
    with pytest.raises(RuntimeError, match="run seed 0: the direct run's outcome differs"):
        bench.simulator_floor(runs=2)
