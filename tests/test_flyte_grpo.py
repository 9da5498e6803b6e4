"""The GRPO tasks (`rl.deploy.flyte.grpo_tasks`) and driver (`rl.deploy.flyte.grpo`) in Flyte's real local mode, on the
tiny model.

The Flyte binding must add orchestration and nothing else: its run trains the same adapter, bit for bit, as the same
components wired in one process (`rl.deploy.local`), and a driver that dies after an iteration resumes from its
checkpoint.
"""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path

import flyte
import pandas as pd
import pytest
from flyte_support import LocalFlyte, isolated_flyte

from rl.deploy.flyte.bindings import DirArtifacts, dir_of, ref_of
from rl.deploy.flyte.config import FaultSpec, GrpoRunConfig, smoke
from rl.deploy.flyte.grpo import GrpoRunResult, train_rl
from rl.deploy.flyte.grpo_faults import train_rl_clustered_with_faults, train_rl_with_faults
from rl.deploy.local import local_grpo
from rl.errors import ArtifactCorruptError, ArtifactNotFoundError
from rl.loop.grpo import GrpoOutcome, run_grpo
from rl.storage.artifacts import compute_digest, read_dir
from rl.storage.checkpoint.format import decode_state
from rl.storage.run_dir import open_run
from rl.storage.volumes.buffer import PANDAS_DTYPES
from rl.types import ArtifactRef

pytestmark = pytest.mark.flyte

CONFIG = smoke()


@pytest.fixture
def flyte_local(tmp_path, monkeypatch):
    with isolated_flyte(tmp_path, monkeypatch) as local:
        yield local


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> GrpoOutcome:
    """The same configuration run in one process on the same components, without Flyte."""
    config: GrpoRunConfig = CONFIG
    with open_run(tmp_path_factory.mktemp("reference"), command="test") as run:
        deployment = local_grpo(run, config.grpo, model=config.model.tiny, trainer=config.trainer, reward=config.reward)
        return asyncio.run(run_grpo(config.grpo, deployment.tiers, deployment.store))


def _digest(directory_path: str) -> str:
    return compute_digest(read_dir(Path(directory_path)))


def _adapter_uploads(raw_data_path: Path) -> list[str]:
    """Names of every adapter directory a train task uploaded into the run's raw data (`adapter-v<N>`)."""
    return sorted(p.name for p in raw_data_path.rglob("adapter-v*") if p.is_dir())


def test_train_rl_runs_three_iterations_and_trains_what_the_in_process_loop_trains(flyte_local: LocalFlyte, reference):
    """The training-loop tutorial: the driver task runs every iteration once; the Flyte tiers reproduce the in-process
    adapter bit for bit."""
    run = flyte_local.run(train_rl, config=CONFIG)
    result: GrpoRunResult = run.output

    assert [row.iteration for row in result.history] == [0, 1, 2]
    assert [row.policy_version for row in result.history] == [1, 2, 3]
    assert result.policy_version == 3 and result.resumed_from == -1
    assert [e.policy_version for e in result.evals] == [1, 2, 3]
    # The adapter is a Dir whose hash is its content digest, and that content is the in-process run's.
    assert result.adapter.hash == _digest(result.adapter.path) == reference.adapter.digest
    assert result.optimizer_state.hash == reference.optimizer_state.digest
    assert result.history == reference.history
    assert result.evals == reference.evals
    assert sum(row.contributing for row in result.history) > 0  # the smoke profile has signal to learn from
    _assert_buffer_holds_each_iteration_once(result)


def _assert_buffer_holds_each_iteration_once(result: GrpoRunResult) -> None:
    """The training-loop tutorial: "Store them on a volume that each iteration forks and adds to" — here one Dir version
    per iteration."""
    files = read_dir(Path(result.rollouts_uri))
    assert compute_digest(files) == result.rollouts_digest
    assert sorted(files) == ["iter-00000.jsonl", "iter-00001.jsonl", "iter-00002.jsonl"]
    for row in result.history:
        stored = pd.read_json(io.BytesIO(files[f"iter-{row.iteration:05d}.jsonl"]), lines=True, dtype=PANDAS_DTYPES)
        assert len(stored) == row.num_rollouts and stored["reward"].mean() == pytest.approx(row.mean_reward)


def test_train_rl_publishes_a_report_with_the_metrics_of_every_iteration(flyte_local: LocalFlyte):
    """The training-loop tutorial: "report=True and flyte.report.replace.aio publish reward, accuracy, and loss after
    every iteration"."""
    run = flyte_local.run(train_rl, config=CONFIG)
    page = run.report_html()
    last = run.output.history[-1]
    assert "status: <b>complete</b>" in page
    assert f"iteration {last.iteration} · policy v{last.policy_version}" in page
    assert f"mean reward {last.mean_reward:.3f}" in page and f"accuracy {last.task_metrics['accuracy']:.3f}" in page
    if last.contributing:
        assert f"loss {last.mean_loss:.4f}" in page and f"KL {last.kl:.4f}" in page
    else:
        assert "no step (no group had signal)" in page
    assert page.count("<svg") == page.count('<figure class="panel"') == 9  # one chart per panel, phases included
    assert "profile smoke" in page and "engine torch" in page


def test_a_driver_that_fails_after_iteration_one_resumes_from_its_checkpoint(flyte_local: LocalFlyte, reference):
    """The training-loop tutorial: a later attempt "loads that state and continues from the next iteration instead of
    from the start".

    Local mode never sets FLYTE_ATTEMPT_NUMBER, so the failure is armed by a marker file: attempt 1 writes it and dies
    right after checkpointing iteration 1; attempt 2 finds it and runs on. The run cache is off, so an iteration run
    twice would upload its adapter twice.
    """
    marker = flyte_local.root / "crashed"
    faults = FaultSpec(crash_after_iteration=1, crash_marker=str(marker))
    task = train_rl_with_faults.override(retries=1)
    run = flyte_local.run(task, config=CONFIG, faults=faults, disable_run_cache=True)
    result: GrpoRunResult = run.output

    assert marker.is_file()  # attempt 1 did fail
    assert result.resumed_from == 1  # attempt 2 loaded the checkpoint of iteration 1, not iteration 0
    assert [row.iteration for row in result.history] == [0, 1, 2]
    assert [row.policy_version for row in result.history] == [1, 2, 3]
    assert _adapter_uploads(flyte_local.raw_data_path) == ["adapter-v0", "adapter-v1", "adapter-v2", "adapter-v3"]
    # Resuming changed nothing about what was trained.
    assert result.adapter.hash == reference.adapter.digest
    assert result.history == reference.history
    checkpoint = decode_state((flyte_local.raw_data_path / "checkpoint").read_bytes())
    assert checkpoint.iteration == 2 and checkpoint.adapter.digest == result.adapter.hash
    _assert_buffer_holds_each_iteration_once(result)
    versions = sorted(p.name for p in flyte_local.raw_data_path.rglob("rollouts-iter-*") if p.is_dir())
    assert versions == ["rollouts-iter-00000", "rollouts-iter-00001", "rollouts-iter-00002"]  # none added twice
    assert "resumed from the checkpoint after iteration 1" in run.report_html()


def test_the_driver_declares_every_tier_it_calls_and_the_tiers_their_own_failure_handling():
    """The training-loop tutorial: "depends_on lists every environment the driver calls, so deploying the driver deploys
    the whole loop"."""
    from rl.deploy.flyte import envs, grpo, grpo_tasks

    declared = {env.name for env in envs.grpo_driver_env.depends_on}
    rollout = {envs.rollout_env.name, envs.cpu_rollout_env.name}  # vLLM's GPU pods, the torch sampler's CPU pods
    assert declared == {*rollout, envs.reward_env.name, envs.train_env.name, envs.buffer_env.name}
    called = [
        grpo_tasks.build_base,
        grpo_tasks.init_adapter,
        grpo_tasks.generate,
        grpo_tasks.generate_groups,
        grpo_tasks.generate_on_cpu,
        grpo_tasks.score_group,
        grpo_tasks.train_step,
        grpo_tasks.evaluate,
        grpo_tasks.evaluate_on_cpu,
        grpo_tasks.add_rollouts,
    ]
    assert {task.parent_env_name for task in called} == declared
    for task in called:
        assert task.retries.count >= 1, task.name
        assert task.timeout is not None, task.name
    assert grpo.train_rl.retries.count >= 1 and grpo.train_rl.report
    assert json.dumps(envs.ENV_VARS)  # the sizing the container re-reads travels with every environment


_probe_env = flyte.TaskEnvironment(name="test-dir-artifacts")


@_probe_env.task
async def _exercise_dir_artifacts() -> list[str]:
    """The Artifacts contract, exercised on DirArtifacts inside a task (it needs the task's raw-data path)."""
    store, seen = DirArtifacts(), []
    ref = await store.put({"a.txt": b"1", "sub/b.bin": b"\x00"}, name="probe")
    twin = await store.put({"sub/b.bin": b"\x00", "a.txt": b"1"}, name="probe")
    seen.append("content-addressed" if twin.digest == ref.digest and twin.uri != ref.uri else "not content-addressed")
    seen.append("dir round-trip" if ref_of(dir_of(ref)) == ref else "dir round-trip broken")
    copy = await store.get(ref)
    copy["a.txt"] = b"changed"
    seen.append("private copy" if (await store.get(ref))["a.txt"] == b"1" else "shared copy")
    gone = ArtifactRef(uri=ref.uri + "-gone", digest=ref.digest)
    try:
        await store.get(gone)
    except ArtifactNotFoundError:
        seen.append("missing raises" if not await store.exists(gone) and await store.exists(ref) else "exists wrong")
    (Path(ref.uri) / "a.txt").write_bytes(b"tampered")
    try:
        await store.get(ref)
    except ArtifactCorruptError:
        seen.append("corruption detected")
    return seen


def test_dir_artifacts_copy_verify_and_address_by_content(flyte_local: LocalFlyte):
    """The rollouts tutorial: weights travel as Dirs; a consumer gets a private, verified copy (a local Dir alone is not
    a copy)."""
    seen = flyte_local.run(_exercise_dir_artifacts).output
    assert seen == ["content-addressed", "dir round-trip", "private copy", "missing raises", "corruption detected"]


def test_the_production_drivers_take_no_fault_knob_and_their_failure_injected_twins_do():
    """Issue 20: as in the agentic loop, a crash is injected by wrapping a tier (the checkpoint store), in drivers of
    their own; `train_rl` and `train_rl_clustered`, what a cluster runs, take the run config alone."""
    from rl.deploy.flyte.clustered import train_rl_clustered

    assert "faults" not in GrpoRunConfig.model_fields
    for task in (train_rl, train_rl_clustered):
        assert list(task.native_interface.inputs) == ["config"], task.name
    for task in (train_rl_with_faults, train_rl_clustered_with_faults):
        assert list(task.native_interface.inputs) == ["config", "faults"], task.name


def test_a_run_after_its_cached_files_were_deleted_rebuilds_them_and_trains_the_same_adapter(
    flyte_local: LocalFlyte, reference
):
    """Local mode keeps Dirs under the raw-data path (/tmp) and its cache under ~/.flyte, so a reboot deletes the one
    and not the other. The next run used to reuse cached results naming deleted files: the driver died at "model
    directory ... does not exist", and later tasks returned adapters that were gone. Each cached result that names a
    file is checked, and a stale one is run again; after a second wipe, the rerun's own cache entry is stepped past."""
    import shutil

    for wipe in range(3):
        result: GrpoRunResult = flyte_local.run(train_rl, config=CONFIG).output
        assert _digest(result.adapter.path) == result.adapter.hash == reference.adapter.digest, f"after wipe {wipe}"
        assert _digest(result.optimizer_state.path) == reference.optimizer_state.digest
        assert result.history == reference.history
        shutil.rmtree(flyte_local.raw_data_path)  # every Dir and the checkpoint; the cache in HOME stays
