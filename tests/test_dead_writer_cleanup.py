"""What a killed writer left half-written (checkpoint temp files, staging directories) is deleted at the next start;
what a live writer holds, and anything not named like our temp files, stays."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import pytest

from rl.storage.checkpoint.file_store import FileCheckpointStore


def _hold(path: Path) -> int:
    """Lock `path` as its live writer would (`rl.storage.dead_writers`); close the fd to 'die'."""
    fd = os.open(path, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def test_a_run_start_deletes_what_dead_writers_left_and_keeps_live_and_foreign_files(tmp_path):
    """`open_run` and `local_grpo` (the start of `rl demo grpo`) clean every store's leftovers of a killed writer."""
    from rl.deploy.local import local_grpo
    from rl.loop.grpo import GrpoConfig
    from rl.storage.run_dir import open_run

    out = tmp_path / "run"
    dead = [
        out / ".checkpoint.json.ab12cd34",
        out / "artifacts" / "tmp" / ("0" * 32),
        out / "artifacts" / "tmp" / f"ref-{'1' * 32}",
        out / "artifacts" / "tmp" / f"corrupt-{'2' * 32}",
        out / "volumes" / "staging" / "rollouts",
        out / f".base-{'3' * 12}.staging-{'4' * 32}",
    ]
    live = [out / ".checkpoint.json.zz99yy88", out / "artifacts" / "tmp" / ("5" * 32)]
    foreign = [out / ".checkpoint.json.bak", out / "artifacts" / "tmp" / "mine.txt", out / "notes.tmp"]
    for p in dead + live + foreign:
        p.parent.mkdir(parents=True, exist_ok=True)
        if p.name.startswith(("0", "corrupt-", "5", "rollouts", ".base")):
            (p / "data").mkdir(parents=True)
        else:
            p.write_text("x")
    fds = [_hold(p) for p in live]
    try:
        with open_run(out, command="test") as run:
            local_grpo(run, GrpoConfig(iterations=1, prompts_per_iteration=2, group_size=2))
        assert [p for p in dead if os.path.lexists(p)] == []
        assert all(p.exists() for p in live + foreign)
    finally:
        for fd in fds:
            os.close(fd)


@pytest.mark.asyncio
async def test_a_checkpoint_write_cleans_nothing_of_its_own_and_leaves_no_temp_file(tmp_path):
    """A completed save leaves only checkpoint.json; a temp file whose writer died is discarded by the next start."""
    store = FileCheckpointStore(tmp_path / "checkpoint.json")
    await store.save(b"one")
    (tmp_path / ".checkpoint.json.dead0001").write_bytes(b"half")
    assert store.discard_abandoned() == [tmp_path / ".checkpoint.json.dead0001"]
    await store.save(b"two")
    assert sorted(os.listdir(tmp_path)) == ["checkpoint.json"] and await store.load() == b"two"


@pytest.mark.asyncio
@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="names an open descriptor's path through /proc")
async def test_a_put_whose_new_entries_a_cleaner_took_before_the_lock_makes_new_ones(tmp_path, monkeypatch):
    """The race `rl.storage.dead_writers` closes from the writer's side: a cleaner that deletes a put's fresh staging
    directory or ref temp file before the put locks it leaves the put to make another; the artifact lands whole and
    tmp/ is left empty."""
    import rl.storage.dead_writers as dead_writers
    from rl.storage.artifacts import LocalArtifacts

    store = LocalArtifacts(tmp_path / "artifacts")
    real, taken = dead_writers.flock, []

    def cleaner_first(fd: int, *args: object, **kwargs: object) -> None:
        path = Path(os.readlink(f"/proc/self/fd/{fd}"))
        kinds = [p.name.startswith("ref-") for p in taken]
        if path.parent == store.root / "tmp" and path.name.startswith("ref-") not in kinds:  # the first of each
            taken.append(path)
            os.rmdir(path) if path.is_dir() else os.unlink(path)
        real(fd, *args, **kwargs)

    monkeypatch.setattr(dead_writers, "flock", cleaner_first)
    files = {"adapter_model.safetensors": b"weights", "sub/config.json": b"{}"}
    ref = await store.put(files, name="adapter-v1")
    assert [p.name.startswith("ref-") for p in taken] == [False, True]  # the staging directory, then the ref's file
    assert await store.get(ref) == files and store.resolve("adapter-v1") == ref
    assert os.listdir(store.root / "tmp") == []


def test_a_new_directory_removed_by_a_cleaner_before_its_lock_is_made_again(tmp_path, monkeypatch):
    """Between a writer's mkdir and its lock another process's cleaner may find the directory unlocked and remove it
    (two xdist workers loading a model at once did); the writer makes a new one instead of failing."""
    from rl.storage import dead_writers
    from rl.storage.safe_fs import Tree

    names = iter(["stage-a", "stage-b"])
    real_open = dead_writers.open_dir_at
    raced: list[str] = []

    def cleaner_first(dir_fd: int, name: str) -> int:
        if not raced:  # the first directory: a cleaner gets to it before the writer opens it
            raced.append(name)
            assert dead_writers.discard_if_dead(tmp_path / name, Tree(tmp_path))
        return real_open(dir_fd, name)

    monkeypatch.setattr(dead_writers, "open_dir_at", cleaner_first)
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with dead_writers.locked_new_dir_at(fd, lambda: next(names)) as (name, _):
            assert (raced, name) == (["stage-a"], "stage-b")
            assert (tmp_path / "stage-b").is_dir() and not (tmp_path / "stage-a").exists()
            assert not dead_writers.discard_if_dead(tmp_path / "stage-b", Tree(tmp_path))  # locked: left alone
    finally:
        os.close(fd)
