"""Chaos that explores: swarm fault plans, seeded interleavings, exhausted retries with a liveness phase, traces."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rl.deploy.simulated.agentic_sim import AgenticSim, default_inputs
from rl.deploy.simulated.chaos import CHAOS_GRPO, _grpo_reference, grpo_random, grpo_swarm, resume_violations
from rl.deploy.simulated.chaos_agentic import _reference, agentic_report, check_agentic_run
from rl.deploy.simulated.grpo_sim import TRAIN, grpo_sim, lineage_violations, outcome_violations
from rl.durable.durable_sim import DurableSimulator
from rl.durable.faults import FaultPlan
from rl.durable.swarm import FAULT_KINDS, coverage
from rl.durable.virtual_loop import VirtualTimeLoop
from rl.errors import DriverAttemptsExhausted, RetriesExhaustedError, TaskFailed
from rl.loop.grpo import GrpoConfig

SMALL = GrpoConfig(iterations=2, prompts_per_iteration=2, group_size=2, seed=0)


# -- swarm ----------------------------------------------------------------------------------------------------------


def test_the_seed_draws_which_fault_kinds_are_on_their_rates_budgets_and_latencies():
    """VOPR/BUGGIFY: not one fixed mix: seeds differ in the kinds enabled, not just where faults land."""
    draws = [grpo_swarm(seed) for seed in range(40)]
    assert grpo_swarm(3) == grpo_swarm(3)
    assert len({d.enabled for d in draws}) > 10
    assert len({d.plan.task_failure_p for d in draws}) > 2
    assert len({tuple(sorted(d.task_retries.items())) for d in draws}) > 10
    assert len({(d.latency_scale, d.jitter_scale) for d in draws}) > 4
    assert len({d.run_seed for d in draws}) > 8
    assert any(not d.enabled for d in draws) or all(d.enabled for d in draws)  # a quiet run is allowed, not required


def test_every_fault_kind_is_exercised_by_some_scenario_and_the_count_is_reported():
    """Coverage is counted from faults that fired, so a kind that never fires shows up as 0, not as assumed."""
    reports = [grpo_random(False, config=SMALL)(seed) for seed in range(40)]
    counts = coverage(reports)
    assert set(counts) == set(FAULT_KINDS), counts
    assert [(r.seed, r.violations) for r in reports if r.violations] == []
    quiet = [r for r in reports if not r.exercised]
    assert all(not r.error for r in quiet)


# -- interleavings --------------------------------------------------------------------------------------------------


def _finish_order(
    tie_break_seed: int | None, *, debug: bool = False, workers: int = 8, twice: bool = False
) -> list[int]:
    order: list[int] = []

    async def worker(i: int) -> None:
        await asyncio.sleep(1.0)  # every worker wakes at the same virtual instant
        order.append(i)
        if twice:
            await asyncio.sleep(0)  # and steps again, in the next batch of ready callbacks
            order.append(-i)

    async def main() -> None:
        await asyncio.gather(*(worker(i) for i in range(workers)))

    loop = VirtualTimeLoop(tie_break_seed)
    loop.set_debug(debug)
    try:
        loop.run_until_complete(main())
    finally:
        loop.close()
    return order


def test_ties_among_ready_tasks_are_broken_by_the_seed():
    """Without a seed, one fixed order (asyncio's); with one, the seed's order, the same every time, and other seeds
    give other orders: seed 1 reorders what the unseeded loop runs."""
    fixed = _finish_order(None)
    assert sorted(fixed) == list(range(8)) and _finish_order(None) == fixed
    assert _finish_order(7) == _finish_order(7)
    orders = {tuple(_finish_order(seed)) for seed in range(6)}
    assert len(orders) > 3
    assert _finish_order(1) != fixed


@pytest.mark.parametrize("tie_break_seed", [None, 0, 1, 7, 12345])
def test_the_loops_fast_iteration_interleaves_exactly_as_asyncios_own(tie_break_seed):
    """The virtual loop's fast paths (debug off: `_run_once`, `call_soon`, `call_later`, `create_task`) run callbacks in
    the order asyncio's own (debug on,
    the shuffle drawn by `_ShuffledReady.popleft` with `randrange`) runs them, for every seed and batch size."""
    for workers in (1, 2, 3, 8, 33):
        fast = _finish_order(tie_break_seed, workers=workers, twice=True)
        assert fast == _finish_order(tie_break_seed, debug=True, workers=workers, twice=True)
        assert sorted(fast) == sorted([*range(workers), *(-i for i in range(workers))])


def _log(tie_break_seed: int) -> list[str]:
    setup = grpo_sim(SMALL, seed=0, tie_break_seed=tie_break_seed)
    assert setup.run().ok
    return setup.sim.log_lines()


def test_same_seed_same_interleaving_byte_identical_log_another_seed_another_order():
    """The tie-break seed is part of the scenario: one seed replays one interleaving byte for byte."""
    assert "\n".join(_log(11)).encode() == "\n".join(_log(11)).encode()
    assert _log(11) != _log(12)


def test_a_killed_drivers_log_does_not_depend_on_where_its_tasks_live_in_memory(monkeypatch):
    """A kill cancels the attempt's tasks; `asyncio.all_tasks` lists them in memory-address order, which differs
    from process to process. Listed backwards, the same seed must still give the same log (seed 52 of pipelined GRPO
    tears a checkpoint while several groups are in flight: its log differed between processes)."""
    scenario = grpo_random(pipelined=True, trace=True)
    forwards = scenario(52).trace
    listed = asyncio.all_tasks
    monkeypatch.setattr(asyncio, "all_tasks", lambda loop=None: list(listed(loop))[::-1])
    assert scenario(52).trace == forwards


def test_a_shuffled_interleaving_still_reaches_the_fifo_result():
    fifo = grpo_sim(SMALL, seed=0).run().output
    for seed in range(4):
        shuffled = grpo_sim(SMALL, seed=0, tie_break_seed=seed).run().output
        assert outcome_violations(fifo, shuffled) == []


# -- exhausted retries ----------------------------------------------------------------------------------------------


def test_a_task_out_of_retries_fails_the_run_naming_it_and_a_recover_rerun_reaches_the_uninterrupted_result():
    """The outage hits every train step on every attempt; after it ends, recover resumes with no step applied twice."""
    plan = FaultPlan(seed=0, exhaust_p=1.0, exhaust_tasks=frozenset({TRAIN}))
    setup = grpo_sim(CHAOS_GRPO, seed=0, faults=plan)
    failed = setup.run(retries=1)
    assert isinstance(failed.error, TaskFailed) and isinstance(failed.error, RetriesExhaustedError)
    assert failed.error.task == TRAIN and TRAIN in str(failed.error) and "recover=True" in str(failed.error)
    committed = set(setup.sim.journal(failed.run_id))
    assert committed  # the rollouts and rewards of iteration 0 finished before the train step failed
    setup.sim.faults = plan.outage_over()
    resumed = setup.sim.rerun(failed, driver=setup.driver, recover=True)
    assert resume_violations(setup.sim.events, failed, resumed, committed) == []
    assert setup.sim.count("action.recovered", run=resumed.run_id) == len(committed)
    assert outcome_violations(_grpo_reference(False, 0), resumed.output) == []
    assert lineage_violations(CHAOS_GRPO, setup, resumed.output) == []


def test_the_resume_check_catches_a_resume_that_re_executes_committed_work():
    """Without recover the rerun executes the committed actions again, and the liveness check says which."""
    plan = FaultPlan(seed=0, exhaust_p=1.0, exhaust_tasks=frozenset({TRAIN}))
    setup = grpo_sim(CHAOS_GRPO, seed=0, faults=plan)
    failed = setup.run()
    committed = set(setup.sim.journal(failed.run_id))
    setup.sim.faults = plan.outage_over()
    fresh = setup.sim.rerun(failed, driver=setup.driver, recover=False)
    found = resume_violations(setup.sim.events, failed, fresh, committed)
    assert found and all("executed again on resume" in v for v in found)


def test_a_driver_killed_on_every_attempt_fails_with_a_typed_error_saying_what_to_do():
    sim = DurableSimulator(seed=0)

    @sim.task
    async def step(i: int) -> int:
        return i

    async def driver() -> int:
        return sum([await step(i) for i in range(3)])

    result = sim.run(driver, retries=1, crash_at=[1, 2])
    assert isinstance(result.error, DriverAttemptsExhausted) and isinstance(result.error, RetriesExhaustedError)
    assert "all 2 attempt(s)" in str(result.error) and "recover=True" in str(result.error)
    assert sim.fired["exhausted_driver"] == 1
    assert sim.rerun(result, driver=driver, recover=True).output == 3


def test_swarm_scenarios_exhaust_retries_and_then_resume_for_both_loops():
    grpo = [grpo_random(True, config=SMALL)(seed) for seed in range(30)]
    agentic = [agentic_report(seed) for seed in range(30)]
    for reports in (grpo, agentic):
        assert [(r.seed, r.violations) for r in reports if r.violations] == []
        assert any("TaskFailed" in r.error for r in reports) or any("Exhausted" in r.error for r in reports)
    assert any("DriverAttemptsExhausted" in r.error for r in grpo + agentic)


# -- explain and shrink ---------------------------------------------------------------------------------------------


def test_a_trace_shows_the_scenario_the_event_log_and_a_final_state_digest():
    report = grpo_random(False, trace=True)(3)
    text = "\n".join(report.trace)
    assert text.startswith("scenario seed=3 run_seed=")
    for needle in ("enabled faults:", "task retries:", "event log:", "driver.start", "final state digest:"):
        assert needle in text
    digest_line = report.trace[-1]
    ours, reference = digest_line.split("digest: ")[1].split(" (reference ")
    assert reference.rstrip(")") == ours  # the run reached the uninterrupted state
    assert grpo_random(False, trace=True)(3).trace == report.trace


@settings(max_examples=12, deadline=None)
@given(st.data())
def test_hypothesis_fault_plans_keep_every_grpo_invariant(data):
    """Hypothesis draws the plan, so a failing one shrinks to the fewest faults (a rate of 0 is the simplest draw)."""
    rate = st.sampled_from([0.0, 0.05, 0.2, 0.5])
    plan = FaultPlan(
        seed=data.draw(st.integers(0, 2**16), label="seed"),
        task_failure_p=data.draw(rate, label="task_failure_p"),
        task_hang_p=data.draw(rate, label="task_hang_p"),
        driver_crash_p=data.draw(st.sampled_from([0.0, 0.02, 0.08]), label="driver_crash_p"),
        torn_checkpoint_p=data.draw(rate, label="torn_checkpoint_p"),
        max_driver_crashes=data.draw(st.integers(1, 3), label="max_driver_crashes"),
    )
    pipelined = data.draw(st.booleans(), label="pipelined")
    tie_break_seed = data.draw(st.none() | st.integers(0, 2**16), label="tie_break_seed")
    config = GrpoConfig(iterations=2, prompts_per_iteration=2, group_size=2, seed=0, pipelined=pipelined)
    setup = grpo_sim(config, seed=0, faults=plan, tie_break_seed=tie_break_seed)
    result = setup.run(retries=plan.max_driver_crashes + 1)
    assert result.ok, result.error
    reference = grpo_sim(config, seed=0).run().output
    assert outcome_violations(reference, result.output) + lineage_violations(config, setup, result.output) == []


@settings(max_examples=10, deadline=None)
@given(st.data())
def test_hypothesis_fault_plans_keep_every_agentic_invariant(data):
    """The agentic loop under a drawn plan and drawn knobs; a failure shrinks towards no faults and no knobs."""
    rate = st.sampled_from([0.0, 0.1, 0.3])
    plan = FaultPlan(
        seed=data.draw(st.integers(0, 2**16), label="seed"),
        task_failure_p=data.draw(rate, label="task_failure_p"),
        task_hang_p=data.draw(rate, label="task_hang_p"),
        driver_crash_p=data.draw(st.sampled_from([0.0, 0.03, 0.1]), label="driver_crash_p"),
        max_driver_crashes=data.draw(st.integers(1, 3), label="max_driver_crashes"),
    )
    knobs = {
        "flaky_trial_rate": data.draw(st.sampled_from([0.0, 0.25, 0.5]), label="flaky_trial_rate"),
        "judge_flake_rate": data.draw(st.sampled_from([0.0, 0.3, 0.6]), label="judge_flake_rate"),
        "crash_driver_at_step": data.draw(st.sampled_from([-1, 0, 1]), label="crash_driver_at_step"),
    }
    shape = {"n_steps": 2, "n_worlds": 2, "prompts_per_step": 2, "n_samples": 1}
    tie_break_seed = data.draw(st.none() | st.integers(0, 2**16), label="tie_break_seed")
    harness = AgenticSim(0, plan, tie_break_seed=tie_break_seed)
    result = harness.run(retries=plan.max_driver_crashes + 2, **shape, **knobs)
    reference = _reference(0, frozenset(), {**default_inputs(0), **shape})
    assert check_agentic_run(harness, result, reference) == []


@pytest.mark.parametrize("loop", ["grpo", "grpo-pipelined", "agentic"])
def test_seeds_are_grouped_so_that_each_reference_run_is_computed_in_one_process(loop):
    """`rl chaos --jobs N` hands a process whole groups: every seed in exactly one group, and a group's scenarios,
    run on a cold cache, compute exactly one reference run between them (and no other group needs it)."""
    from rl.deploy.simulated import chaos, chaos_agentic
    from rl.deploy.simulated.scenarios import grouped_by_reference, reference_key, scenarios_in_worker

    seeds = list(range(48))
    groups = grouped_by_reference(loop, seeds)
    assert sorted(s for group in groups for s in group) == seeds
    assert all(group == sorted(group) for group in groups)
    assert len({reference_key(loop, group[0]) for group in groups}) == len(groups)
    if loop != "agentic":
        assert len(groups) <= chaos.RUN_SEEDS < len(seeds)  # 32 references, not one per seed
    cache = chaos_agentic._cached_reference if loop == "agentic" else chaos._grpo_reference
    group = min((g for g in groups if len(g) > 1), key=len)
    cache.cache_clear()
    assert all(report.ok for report in scenarios_in_worker(loop, group))
    assert cache.cache_info().currsize == 1
