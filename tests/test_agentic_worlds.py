"""Worlds: sealed once, forked copy-on-write per trial; the parent never changes (the agentic tutorial's volumes)."""

from __future__ import annotations

import asyncio

import pytest

from rl.agentic.bandit import BanditTrainer
from rl.agentic.judge import judge_score
from rl.agentic.tiers import JudgeTier, LocalAgenticTiers, SandboxTier, TrainerTier
from rl.agentic.volume_worlds import VolumeWorlds
from rl.agentic.world import world_files
from rl.deploy.simulated.agentic_sim import AgenticSim
from rl.deploy.simulated.worlds import MemoryWorlds
from rl.errors import RetiredWorkspaceError, UnknownVersionError
from rl.loop.agentic import AgenticConfig, run_agentic
from rl.protocols import Workspace, WorldStore
from rl.storage.volumes import LocalVolumeStore
from rl.types import Rubric, Trajectory

SMALL = {"n_steps": 2, "n_worlds": 2, "prompts_per_step": 2, "n_samples": 2}


def test_a_fork_reads_its_parent_and_its_writes_reach_neither_the_parent_nor_a_sibling():
    """The agentic tutorial: "The trial writes freely into its private copy; reset is free because the parent volume
    never changes"."""
    store = MemoryWorlds()
    parent = store.seal("world-w0", {"docs/a.txt": "A"}, "world w0")
    one, two = store.fork(parent, "f1"), store.fork(parent, "f2")
    assert isinstance(store, WorldStore) and isinstance(one, Workspace)
    one.write_text("answer.txt", "42")
    one.write_text("docs/a.txt", "overwritten in my copy")
    assert one.read_text("docs/a.txt") == "overwritten in my copy" and two.read_text("docs/a.txt") == "A"
    with pytest.raises(FileNotFoundError):
        two.read_text("answer.txt")
    assert store.read(parent) == {"docs/a.txt": "A"}
    sealed = one.finalize("trial f1")
    assert store.read(sealed)["answer.txt"] == "42" and store.read(parent) == {"docs/a.txt": "A"}
    with pytest.raises(UnknownVersionError, match="what seal"):
        store.fork("nope", "f3")


def test_re_forking_a_name_retires_the_earlier_writer():
    """A fork has one writer: a dead attempt's sandbox cannot write into the world its retry regenerates in."""
    store = MemoryWorlds()
    parent = store.seal("world-w0", {"docs/a.txt": "A"}, "world w0")
    stale = store.fork(parent, "world-w0-s0-p0-n0")
    fresh = store.fork(parent, "world-w0-s0-p0-n0")
    with pytest.raises(RetiredWorkspaceError, match="one writer"):
        stale.write_text("answer.txt", "stale")
    fresh.write_text("answer.txt", "fresh")
    assert store.forks["world-w0-s0-p0-n0"] is fresh


def test_a_run_leaves_every_parent_world_unchanged_and_each_trial_fork_holds_its_own_answer():
    """The agentic tutorial: "every trial needs its own copy — stale state from a previous attempt is how you get
    silently corrupted training data"."""
    harness = AgenticSim(seed=0)
    result = harness.run(flaky_trial_rate=0.25)
    assert result.ok
    worlds = harness.worlds
    assert isinstance(worlds, MemoryWorlds)
    assert len(worlds.forks) == 18
    for name, fork in worlds.forks.items():
        world_id = name.split("-")[1]
        assert worlds.read(fork.parent) == world_files(0, world_id)
        assert set(fork.written()) <= {"answer.txt", "scratch.tmp"} and fork.state == "finalized"


def _local_volumes(tmp_path):
    return LocalVolumeStore(tmp_path, durable=False)


def test_volume_worlds_on_local_volumes_fork_per_trial_and_never_change_the_parent(tmp_path):
    """The agentic tutorial: "world.fork(...) is a copy-on-write fork of the volume ... the parent volume never
    changes"."""
    worlds = VolumeWorlds(_local_volumes(tmp_path))
    parent = worlds.seal("world-w0-local", world_files(1, "w0"), "world w0")
    fork = worlds.fork(parent, "world-w0-local-s0-p0-n0")
    fork.write_text("answer.txt", "my answer")
    assert fork.read_text("docs/doc_0.txt") == world_files(1, "w0")["docs/doc_0.txt"]
    trial_version = fork.finalize("trial s0-p0-n0")
    assert worlds.read(parent) == world_files(1, "w0")
    assert worlds.read(trial_version) == {**world_files(1, "w0"), "answer.txt": "my answer"}


def test_the_simulated_loop_on_real_local_volumes_matches_the_in_memory_worlds(tmp_path):
    """The simulator's in-memory worlds and real copy-on-write volumes give the same training run, fault for fault."""
    knobs = {**SMALL, "flaky_trial_rate": 0.25, "judge_flake_rate": 0.3, "crash_driver_at_step": 0}
    on_disk = AgenticSim(seed=3, worlds=VolumeWorlds(_local_volumes(tmp_path))).run(**knobs)
    in_memory = AgenticSim(seed=3).run(**knobs)
    assert on_disk.ok and in_memory.ok
    assert on_disk.output.history == in_memory.output.history


async def _judge(traj: Trajectory, rubric: Rubric) -> float:
    return judge_score(traj, rubric)


def test_the_loop_runs_outside_the_simulator_on_real_forks(tmp_path):
    """docs/guarantees.md: "The driver never knows whether a call is a Flyte task, an in-memory tier on the simulator,
    or a plain function"."""
    worlds = VolumeWorlds(_local_volumes(tmp_path))
    trainers: dict[str, BanditTrainer] = {}

    def attach(world_ids):
        return trainers.setdefault("policy", BanditTrainer(world_ids, identity=1))

    tiers = LocalAgenticTiers(SandboxTier(worlds, tool_latency_s=0.0), JudgeTier(_judge), TrainerTier(attach))
    outcome = asyncio.run(run_agentic(AgenticConfig(**SMALL), tiers))
    simulated = AgenticSim(seed=0).run(**SMALL).output
    assert [h.weights for h in outcome.history] == [h.weights for h in simulated.history]
    assert [h.mean_turns for h in outcome.history] == [h.mean_turns for h in simulated.history]
