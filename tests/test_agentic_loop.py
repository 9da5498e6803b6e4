"""The agentic tutorial's durable loop on the simulator: the failure table, skipping, memoised judging,
canonical steps, re-scoring by forking a run, and determinism. Each test quotes the sentence it models."""

from __future__ import annotations

import pytest
from conformance_selftest.broken_agentic import landing_order_driver

from rl.deploy.simulated.agentic_sim import (
    BUILD_WORLD,
    GENERATE,
    JUDGE,
    JUDGE_CALL,
    SETUP,
    TASK_RETRIES,
    TRAIN_STEP,
    AgenticSim,
)
from rl.durable.faults import FaultPlan
from rl.errors import AgenticInputError, InjectedDriverCrash, StepPayloadConflictError, TaskFailed
from rl.types import Rubric

SEED_FAILURES = {"crash_driver_at_step": 1, "flaky_trial_rate": 0.25, "judge_flake_rate": 0.3}
NEW_RUBRIC = Rubric(correctness_weight=1.0, efficiency_weight=1.0, tidiness_weight=0.5, name="v2-efficiency")


def test_the_failure_injected_run_reproduces_the_seeds_table():
    """The agentic tutorial: "all 18 trials completed, the judge was called exactly once per trial, and the bandit still
    learned"."""
    harness = AgenticSim(seed=0)
    result = harness.run(**SEED_FAILURES)
    table = harness.report(result)
    assert table.ok and table.trials_total == 18 and table.trials_completed == 18 and table.trials_skipped == 0
    assert table.generate_succeeded == 18 and table.trial_retries > 0
    assert table.judge_succeeded == 18 and table.judge_retries > 0
    assert table.judge_calls == 18 and table.judge_replays == table.judge_retries
    assert table.train_steps == 3 and table.train_steps_replayed == 2 and len(table.trainer_ids) == 1
    assert table.driver_attempts == 2
    turns = table.mean_turns_by_step
    assert turns[0] > turns[1] > turns[2], turns
    assert table.mean_reward_by_step[-1] > table.mean_reward_by_step[0]
    # the crash: attempt 0 failed right after step 1, attempt 1 replayed steps 0-1 and ran step 2
    assert sum(1 for line in harness.sim.log_lines() if "driver.failed" in line and "InjectedDriverCrash" in line) == 1
    assert harness.sim.count("action.replayed", GENERATE, result.run_id) == 12


def test_a_trial_that_fails_after_its_retries_is_skipped_and_counted_never_fatal():
    """The agentic tutorial: "a trial that fails after retries is skipped, never fatal to the step"."""
    harness = AgenticSim(seed=0, dead_trials={"s0-p1-n0", "s2-p0-n1"})
    result = harness.run(flaky_trial_rate=0.25)
    table = harness.report(result)
    assert table.ok and table.trials_completed == 16 and table.trials_skipped == 2
    assert table.skipped == ["s0-p1-n0", "s2-p0-n1"]
    assert [h.n_trials for h in result.output.history] == [5, 6, 5]
    assert all(s.stage == "generate" and "dead trial" in s.reason for s in result.output.skipped)
    assert harness.sim.count("action.failed", GENERATE) >= 4  # both attempts of both dead trials


def test_a_judging_that_fails_after_its_retries_is_skipped_and_counted_never_fatal():
    """The same rule for the judge: a trial whose judging fails on every attempt (an outage of that action) is skipped
    at "verify_and_judge" and counted; the step trains on the others and the run finishes."""
    harness = AgenticSim(0, FaultPlan(seed=0, exhaust_p=0.2, exhaust_tasks=frozenset({JUDGE})))
    result = harness.run()
    assert result.ok, result.error
    skipped = result.output.skipped
    assert [s.trial_id for s in skipped] == ["s0-p1-n0", "s0-p1-n1", "s1-p0-n0"]
    assert all(s.stage == "verify_and_judge" and "injected outage" in s.reason for s in skipped)
    assert [h.n_trials for h in result.output.history] == [4, 5, 6]
    assert harness.sim.fired["exhausted_task"] == 3 * (TASK_RETRIES[JUDGE] + 1)
    assert harness.report(result).trials_skipped == 3


def test_the_judge_is_billed_once_per_trial_and_rubric_however_often_judging_retries():
    """The agentic tutorial: "retried judge tasks show JUDGE CALLED exactly once in their attempt-0 logs and zero times
    on the retry"."""
    harness = AgenticSim(4, FaultPlan(seed=4, task_failure_p=0.5))
    result = harness.run(judge_flake_rate=1.0)
    assert result.ok
    assert harness.sim.count("action.retry", JUDGE) >= 18  # every judging task failed at least once after the call
    assert sorted(harness.judge.billed.values()) == [1] * 18
    assert harness.sim.count("trace.replayed", JUDGE_CALL) >= 18


@pytest.mark.parametrize(("sort_rewards", "train_replayed"), [(True, 2), (False, 0)])
def test_unsorted_rewards_re_execute_the_step_on_driver_replay_and_sorted_ones_replay(sort_rewards, train_replayed):
    """The agentic tutorial: "a driver replay collected the same rewards in a different as_completed order — so the
    training step's inputs hashed differently, the step re-ran instead of replaying"; "the fix is one sorted()"."""
    harness = AgenticSim(seed=0) if sort_rewards else AgenticSim(seed=0, driver=landing_order_driver)
    result = harness.run(crash_driver_at_step=1)
    sim, trainer = harness.sim, harness.trainer_of(result)
    assert sim.count("action.replayed", TRAIN_STEP) == train_replayed
    assert trainer is not None and all(n == 1 for n in trainer.applications.values())
    if sort_rewards:
        assert result.ok and sim.count("action.completed", TRAIN_STEP) == 3
    else:
        # the re-executed step 0 reached the trainer with a reordered payload: refused, never applied twice
        assert isinstance(result.error, TaskFailed) and isinstance(result.error.cause, StepPayloadConflictError)
        assert sim.count("action.start", TRAIN_STEP, result.run_id) == 2 + 2  # steps 0, 1, then step 0 twice
        assert dict(trainer.applications) == {0: 1, 1: 1}


def test_rerun_with_a_new_rubric_recovers_step_zero_trials_and_re_runs_judging_and_every_later_step():
    """The agentic tutorial: "worlds, trainer setup, and every step-0 generate action are recovered (reused as-is);
    verify_and_judge re-runs everywhere because its rubric input changed; and — correctly — steps 1 and 2 regenerate
    too"."""
    harness = AgenticSim(seed=0)
    first = harness.run()
    forked = harness.rerun(first, rubric=NEW_RUBRIC)
    assert forked.ok
    sim, run = harness.sim, forked.run_id
    recovered = {t: sim.count("action.recovered", t, run) for t in (BUILD_WORLD, SETUP, GENERATE, JUDGE, TRAIN_STEP)}
    executed = {t: sim.count("action.completed", t, run) for t in (BUILD_WORLD, SETUP, GENERATE, JUDGE, TRAIN_STEP)}
    assert recovered == {BUILD_WORLD: 3, SETUP: 1, GENERATE: 6, JUDGE: 0, TRAIN_STEP: 0}
    assert executed == {BUILD_WORLD: 0, SETUP: 0, GENERATE: 12, JUDGE: 18, TRAIN_STEP: 3}
    # exactly the step-0 generates were recovered: their trajectories are identical, only their scores changed
    step0_before, step0_after = first.output.history[0], forked.output.history[0]
    assert step0_after.mean_turns == step0_before.mean_turns and step0_after.mean_reward > step0_before.mean_reward
    assert all(n == 1 for n in harness.judge.billed.values()) and len(harness.judge.billed) == 36


def test_the_same_seed_twice_gives_an_identical_event_log():
    """docs/guarantees.md: "A same-seed-twice test proves determinism"."""

    def log(seed: int) -> list[str]:
        harness = AgenticSim(seed, FaultPlan(seed=seed, task_failure_p=0.2, task_hang_p=0.1, driver_crash_p=0.03))
        harness.run(retries=4, **SEED_FAILURES)
        return harness.sim.log_lines()

    assert log(5) == log(5)
    assert log(5) != log(6)


def test_a_hung_sandbox_times_out_and_its_retry_regenerates_the_trial():
    """The agentic tutorial: "Each trial is its own task with `retries=1` and a timeout"."""
    harness = AgenticSim(2, FaultPlan(seed=2, task_hang_p=0.5))
    result = harness.run()
    clean = AgenticSim(seed=2).run()
    assert harness.sim.count("action.timeout", GENERATE) > 0
    assert result.ok and result.output.history == clean.output.history


def test_the_driver_crash_injection_fires_on_attempt_zero_only():
    """The agentic tutorial: "if attempt == 0 and step == crash_driver_at_step: raise ... driver crash after step
    {step}"."""
    harness = AgenticSim(seed=0)
    once = harness.run(retries=0, crash_driver_at_step=0)
    assert isinstance(once.error, InjectedDriverCrash) and "after step 0" in str(once.error)
    assert harness.run(retries=1, crash_driver_at_step=0).ok


def test_a_run_with_no_trials_is_refused_before_anything_starts():
    """Typed errors say what was wrong: a shape with zero steps, worlds, prompts or samples cannot train."""
    harness = AgenticSim(seed=0)
    result = harness.run(retries=0, n_samples=0)
    assert isinstance(result.error, AgenticInputError) and "must all be >= 1" in str(result.error)
    assert harness.sim.count("action.start") == 0
    with pytest.raises(TypeError, match="unknown driver inputs"):
        harness.run(temperature=0.7)
