"""The agentic tutorial's agentic loop as Flyte tasks (`rl.deploy.flyte.agentic`) in Flyte's real local mode.

What local mode can show is checked here against the simulator's run of the same seed; what it cannot (driver replay,
the trace memo across retries, `flyte.rerun`, attempt-0-only faults, enforced timeouts) must be reported as remote-only
rather than silently skipped. The simulator's own tests prove those behaviours.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from flyte_support import LocalFlyte, isolated_flyte

from rl.agentic.faults import AgenticFaults
from rl.deploy.flyte import agentic
from rl.deploy.flyte.agentic import SMOKE, AgenticRunResult, fork, train
from rl.deploy.flyte.agentic_faults import AgenticFaultSpec, train_with_faults
from rl.deploy.simulated.agentic_sim import AgenticSim
from rl.errors import RemoteOnlyError
from rl.types import Rubric

pytestmark = pytest.mark.flyte

CONFIG = SMOKE.replace(tool_latency_s=0.0)
TRIALS = CONFIG.n_steps * CONFIG.prompts_per_step * CONFIG.n_samples


@pytest.fixture
def flyte_local(tmp_path, monkeypatch):
    agentic.JUDGE_CALLS.clear()
    with isolated_flyte(tmp_path, monkeypatch) as local:
        yield local


def _trial_worlds(raw_data_path: Path, step: int) -> list[Path]:
    """The sealed copies of the worlds of `step`'s trials that generate tasks uploaded (one per executed trial)."""
    return [p for p in raw_data_path.rglob(f"world-*-s{step}-p*-n*") if p.is_dir()]


def test_the_agentic_driver_runs_locally_and_learns_what_the_simulator_learns(flyte_local: LocalFlyte):
    """The agentic tutorial: every trial completes, the judge is called once per trial, and the bandit learns (turns
    fall)."""
    run = flyte_local.run(train, config=CONFIG)
    result: AgenticRunResult = run.output
    simulated = AgenticSim(seed=CONFIG.seed).run(retries=0, n_steps=CONFIG.n_steps).output

    assert [h.n_trials for h in result.history] == [6, 6, 6] and result.skipped == []
    assert [h.weights for h in result.history] == [h.weights for h in simulated.history]
    assert [h.mean_turns for h in result.history] == [h.mean_turns for h in simulated.history]
    assert [h.mean_reward for h in result.history] == [h.mean_reward for h in simulated.history]
    assert result.history[-1].mean_turns < result.history[0].mean_turns
    assert len(agentic.JUDGE_CALLS) == TRIALS and set(agentic.JUDGE_CALLS.values()) == {1}
    # Every trial forked its world and sealed its own copy; the worlds it forked are unchanged.
    assert len(_trial_worlds(flyte_local.raw_data_path, 0)) == CONFIG.prompts_per_step * CONFIG.n_samples


def test_what_local_mode_cannot_show_is_reported_as_remote_only(flyte_local: LocalFlyte):
    """Trace replay, driver replay, rerun, attempt-0 faults and timeouts are named in the result and in the report."""
    run = flyte_local.run(train, config=CONFIG)
    result: AgenticRunResult = run.output
    assert result.local_mode
    topics = [note.split(":")[0] for note in result.remote_only]
    assert topics == ["driver replay", "trace memo", "attempt-0-only faults", "rerun", "timeouts"]
    page = run.report_html()
    assert "Not exercised in this run" in page and "status: <b>complete</b>" in page
    assert all(topic in page for topic in topics)
    assert page.count("<tr>") == 1 + CONFIG.n_steps  # the header and one row per step


def test_crash_injection_and_fork_refuse_local_mode_with_the_way_to_see_them(flyte_local: LocalFlyte):
    """Local mode never sets the attempt number and cannot rerun: both say so instead of misbehaving."""
    with pytest.raises(Exception, match="crash_driver_at_step needs a cluster"):
        flyte_local.run(train_with_faults, config=CONFIG, faults=AgenticFaultSpec(crash_driver_at_step=1))
    with pytest.raises(RemoteOnlyError, match="fork needs a Flyte cluster"):
        fork("a-finished-run", Rubric(name="v2-efficiency", efficiency_weight=1.0))


def test_a_failed_trial_is_skipped_and_the_step_still_trains(flyte_local: LocalFlyte):
    """The agentic tutorial: a trial that fails after its retries is skipped, never fatal to the step (every trial fails
    here)."""
    faults = AgenticFaultSpec(flaky_trial_rate=1.0)
    result: AgenticRunResult = flyte_local.run(
        train_with_faults, config=CONFIG.replace(n_steps=1), faults=faults
    ).output
    assert [h.n_trials for h in result.history] == [0]
    assert [h.weights.version for h in result.history] == [1]
    assert len(result.skipped) == CONFIG.prompts_per_step * CONFIG.n_samples
    assert {s.stage for s in result.skipped} == {"generate"}
    assert agentic.JUDGE_CALLS == {}


def test_a_new_rubric_locally_reuses_the_worlds_and_the_first_steps_rollouts(flyte_local: LocalFlyte):
    """The agentic tutorial's re-scoring, the open-source way: a second run with a new rubric hits the cache for every
    action whose inputs did not change (worlds, step-0 trials); judging re-runs everywhere, later steps regenerate."""
    first = flyte_local.run(train, config=CONFIG).output
    per_step = CONFIG.prompts_per_step * CONFIG.n_samples
    counts = [len(_trial_worlds(flyte_local.raw_data_path, step)) for step in range(CONFIG.n_steps)]
    assert counts == [per_step] * CONFIG.n_steps

    rubric = Rubric(correctness_weight=1.0, efficiency_weight=1.0, tidiness_weight=0.5, name="v2-efficiency")
    second = flyte_local.run(train, config=CONFIG, rubric=rubric).output
    rerun_counts = [len(_trial_worlds(flyte_local.raw_data_path, step)) for step in range(CONFIG.n_steps)]
    assert rerun_counts[0] == per_step  # step 0's trials were not regenerated
    assert rerun_counts[1:] == [2 * per_step] * (CONFIG.n_steps - 1)  # new weights, new trials
    assert {rubric_name for _, rubric_name in agentic.JUDGE_CALLS} == {"v1", "v2-efficiency"}
    assert sum(agentic.JUDGE_CALLS.values()) == 2 * TRIALS
    assert first.history[0].mean_turns == second.history[0].mean_turns  # identical trajectories, re-scored
    assert first.history[0].mean_reward != second.history[0].mean_reward


def test_the_production_tasks_take_no_fault_knob_and_the_failure_injected_run_does():
    """Issue 20: faults wrap tiers; `generate`, `verify_and_judge` and `train` are what a cluster runs, knob-free."""
    from dataclasses import fields

    knobs = {f.name for f in fields(AgenticFaults)} | {"flaky_rate", "faults"}
    for task in (agentic.generate, agentic.verify_and_judge, agentic.train):
        inputs = set(task.native_interface.inputs)
        assert not inputs & knobs, f"{task.name} takes fault knobs {sorted(inputs & knobs)}"
    assert "faults" in train_with_faults.native_interface.inputs


def test_a_run_after_its_worlds_were_deleted_builds_them_again(flyte_local: LocalFlyte):
    """build_world is cached and its result names the world's files; local mode keeps those under /tmp and the cache
    under ~/.flyte. After the files went, a run whose trials were not all cached (another lr: steps 1 and 2 run new
    trials) forked a world that no longer existed. Each cached world is checked and a deleted one built again."""
    import shutil

    flyte_local.run(train, config=CONFIG)
    shutil.rmtree(flyte_local.raw_data_path)  # every Dir; the task cache in HOME stays
    config = CONFIG.replace(lr=1.0)
    result: AgenticRunResult = flyte_local.run(train, config=config).output
    simulated = AgenticSim(seed=config.seed).run(retries=0, n_steps=config.n_steps, lr=config.lr).output
    assert [h.n_trials for h in result.history] == [6, 6, 6] and result.skipped == []
    assert [h.weights for h in result.history] == [h.weights for h in simulated.history]
