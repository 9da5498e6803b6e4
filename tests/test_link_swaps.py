"""A folder or file of a run directory swapped for a symlink, before or while a command runs, never carries a write or
a delete outside the directory (rl.storage.safe_fs): lock files, temp files, staging, versions, artifact objects,
metrics.

Each attack plants the link after the store or reporter passed its start-up checks, as someone with write access to a
shared run directory could; the outside tree must come out byte for byte as it went in.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
from pathlib import Path

import pytest
from report_rows import rows

from rl import platform
from rl.cli import main
from rl.deploy.file_reporter import FileReporter
from rl.errors import LinkRefusedError, RlError, UnsafeRunDirError
from rl.storage.artifacts import LocalArtifacts
from rl.storage.checkpoint.file_store import FileCheckpointStore
from rl.storage.run_lock import HOLDER_NAME, LOCK_NAME, run_lock
from rl.storage.safe_fs import Tree
from rl.storage.volumes.buffer import VolumeBuffer, rollout_rows
from rl.storage.volumes.rollout_buffer import BUFFER_NAME
from rl.storage.volumes.store import LocalVolumeStore
from rl.types import Rollout


def snapshot(root: Path) -> dict[str, object]:
    """Every entry under `root` (never following a link): its bytes, its link target, or "dir"."""
    out: dict[str, object] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            rel = str(path.relative_to(root))
            if path.is_symlink():
                out[rel] = ("link", os.readlink(path))
            elif path.is_dir():
                out[rel] = "dir"
            else:
                out[rel] = path.read_bytes()
    return out


@pytest.fixture(autouse=True, params=["openat2", "walk"])
def resolution(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every attack twice: directories opened by Linux's openat2 in one syscall, and walked one component at a time
    (macOS, older kernels, sandboxes that refuse openat2)."""
    if request.param == "walk" or platform.OPENAT2 is None:
        monkeypatch.setattr(platform, "OPENAT2", None)
    return str(request.param)


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """Someone's files beside the run directory, shaped like what a store would write into, each holding a keeper."""
    root = tmp_path / "outside"
    for sub in ("staging/rollouts", "versions", "objects", "tmp", "refs", "locks"):
        (root / sub).mkdir(parents=True)
        (root / sub / "keep").write_text("precious\n")
    (root / "file.txt").write_text("precious\n")
    return root


def _rollout(group: int) -> Rollout:
    return Rollout(group, "3+1=", "4", "4", [1, 2], [3], [-0.5], 0, group)


def _swap(path: Path, target: Path) -> None:
    """Replace the directory or file `path` by a symlink to `target`."""
    os.rename(path, path.with_name(path.name + ".real"))
    os.symlink(target, path)


def _buffer(run: Path) -> VolumeBuffer:
    store = LocalVolumeStore(run / "volumes", durable=False)
    buffer = VolumeBuffer(store, BUFFER_NAME)
    buffer.append(0, rollout_rows(0, [_rollout(0)], [1.0]))
    return buffer


@pytest.mark.parametrize("folder", ["staging", "versions", "locks"])
def test_a_store_folder_swapped_for_a_link_after_opening_is_refused(tmp_path, outside, folder):
    """The volume store opened cleanly, then `volumes/<folder>` became a link outside: the next append is refused
    and the outside tree is untouched (today's main deleted `outside/staging/rollouts` and published there)."""
    buffer = _buffer(tmp_path / "run")
    before = snapshot(outside)
    _swap(buffer.store.root / folder, outside / folder)
    with pytest.raises(LinkRefusedError, match=folder):
        buffer.append(1, rollout_rows(1, [_rollout(0)], [1.0]), parent=buffer.head())
    assert snapshot(outside) == before


def test_a_lock_file_that_links_outside_is_not_written_through(tmp_path, outside):
    """`volumes/locks/rollouts.lock` a link to someone's file: taking the writer lock refuses it, the file keeps its
    bytes (today's main truncated it and wrote its pid there)."""
    buffer = _buffer(tmp_path / "run")
    lock = buffer.store.root / "locks" / f"{BUFFER_NAME}.lock"
    lock.unlink()
    os.symlink(outside / "file.txt", lock)
    before = snapshot(outside)
    with pytest.raises(LinkRefusedError, match=r"rollouts\.lock"):
        buffer.append(1, rollout_rows(1, [_rollout(0)], [1.0]), parent=buffer.head())
    assert snapshot(outside) == before


def test_rescore_of_a_directory_with_a_linked_lock_exits_2_and_writes_nothing_outside(tmp_path, outside, capsys):
    """The finding's attack end to end: `rl rescore` on a run whose buffer lock links out exits 2 with one line."""
    run = tmp_path / "run"
    buffer = _buffer(run)
    lock = buffer.store.root / "locks" / f"{BUFFER_NAME}.lock"
    lock.unlink()
    os.symlink(outside / "file.txt", lock)
    before = snapshot(outside)
    assert main(["rescore", str(run), "--reward", "format"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "rollouts.lock" in err[0] and "symlink" in err[0]
    assert snapshot(outside) == before


def test_a_staging_folder_and_lock_planted_as_links_are_not_followed_at_start(tmp_path, outside):
    """A sent directory with `volumes/staging/rollouts` and `locks/rollouts.lock` links: discarding abandoned writers at
    start-up follows neither, and the next append refuses the lock link; nothing outside is written or deleted."""
    buffer = _buffer(tmp_path / "run")
    root = buffer.store.root
    os.symlink(outside / "staging" / "rollouts", root / "staging" / "rollouts")
    (root / "locks" / "rollouts.lock").unlink()
    os.symlink(outside / "file.txt", root / "locks" / "rollouts.lock")
    before = snapshot(outside)
    store = LocalVolumeStore(root, durable=False)
    assert store.discard_abandoned() == []  # a link is no writer's staging: left alone, not followed
    with pytest.raises(LinkRefusedError):
        VolumeBuffer(store, BUFFER_NAME).append(1, rollout_rows(1, [_rollout(0)], [1.0]), parent=buffer.head())
    assert snapshot(outside) == before


@pytest.mark.parametrize("name", [f"{HOLDER_NAME}.{{pid}}.tmp", LOCK_NAME, HOLDER_NAME])
def test_the_run_locks_files_are_never_written_through_a_link(tmp_path, outside, name):
    """The holder record's temp file, the holder record and the lock file planted as links to someone's file: the
    lock either replaces the link or refuses it, and the file keeps its bytes (today's main overwrote it through the
    temp name)."""
    run = tmp_path / "run"
    run.mkdir()
    os.symlink(outside / "file.txt", run / name.format(pid=os.getpid()))
    before = snapshot(outside)
    try:
        with run_lock(run, command="test"):
            pass
    except UnsafeRunDirError:
        assert name == LOCK_NAME  # a lock file that is a link is refused; the others are replaced
    assert snapshot(outside) == before


@pytest.mark.asyncio
async def test_an_artifact_folder_swapped_for_a_link_is_refused(tmp_path, outside):
    """`artifacts/objects` or `artifacts/tmp` became a link after the store opened: a put is refused, nothing lands
    outside (today's main sent every new object there)."""
    for folder in ("objects", "tmp", "refs"):
        store = LocalArtifacts(tmp_path / folder / "artifacts")
        await store.put({"a.bin": b"1"}, name="first")
        before = snapshot(outside)
        _swap(store.root / folder, outside / folder)
        with pytest.raises(LinkRefusedError, match=folder):
            await store.put({"a.bin": b"2"}, name="second")
        assert snapshot(outside) == before


@pytest.mark.heavy
@pytest.mark.asyncio
async def test_metrics_and_checkpoint_swapped_for_links_are_neither_written_nor_read(tmp_path, outside):
    """`metrics.jsonl` linked out after the reporter wrote it once: the next publication refuses it (today's main
    appended to the outside file); `checkpoint.json` linked out is not read."""
    run = tmp_path / "run"
    reporter = FileReporter(run, min_interval_s=1e9)
    row = rows(1)[0]
    await reporter.publish([row], status="running")
    before = snapshot(outside)
    _swap(run / "metrics.jsonl", outside / "file.txt")
    with pytest.raises(LinkRefusedError, match=r"metrics\.jsonl"):
        await reporter.publish([row, row], status="running")
    os.symlink(outside / "file.txt", run / "checkpoint.json")
    with pytest.raises(LinkRefusedError, match=r"checkpoint\.json"):
        await FileCheckpointStore(run / "checkpoint.json").load()
    assert snapshot(outside) == before


def _swapper(
    folders: list[Path], outside: Path, stop: threading.Event, swaps: list[int], started: threading.Event
) -> None:
    """Swap each folder for a link outside and back, over and over, until `stop` (`started` after the first round, or
    when the swapper dies, so the test never waits on a dead thread)."""
    try:
        while not stop.is_set():
            for folder in folders:
                aside = folder.with_name(folder.name + ".real")
                try:
                    os.rename(folder, aside)
                except FileNotFoundError:
                    continue
                os.symlink(outside / folder.name, folder)
                os.sched_yield() if hasattr(os, "sched_yield") else None
                os.unlink(folder)
                os.rename(aside, folder)
                swaps[0] += 1
            started.set()
    finally:
        started.set()


def test_writes_racing_a_thread_that_swaps_folders_for_links_never_reach_outside(tmp_path, outside):
    """Buffer appends and artifact puts while another thread swaps staging, versions, locks, objects, tmp and refs for
    links outside in a loop: each write succeeds or fails with a typed error, nothing outside changes, and every
    version and artifact that was published is intact afterwards, whatever the interleaving."""
    run = tmp_path / "run"
    buffer = _buffer(run)
    artifacts = LocalArtifacts(run / "artifacts")
    folders = [buffer.store.root / f for f in ("staging", "versions", "locks")]
    folders += [artifacts.root / f for f in ("objects", "tmp", "refs")]
    before = snapshot(outside)
    # Read before the swapping starts: a folder renamed aside for a moment makes it fail, and it is not under test.
    published, put, refused = [buffer.head()], [], 0
    stop, started, swaps = threading.Event(), threading.Event(), [0]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # interleave the two threads finely: more swaps land inside a write
    thread = threading.Thread(target=_swapper, args=(folders, outside, stop, swaps, started))
    # Stopped however the test ends: a swapper left running renames folders under every later test of this worker.
    thread.start()
    try:
        started.wait()  # the swapping is under way before the first write, however the threads are scheduled
        for i in range(1, 40):
            try:
                head = published[-1]
                published.append(buffer.append(i, rollout_rows(i, [_rollout(i)], [1.0]), parent=head))
            except (RlError, OSError):
                refused += 1
            try:
                put.append(asyncio.run(artifacts.put({"w.bin": str(i).encode()}, name=f"a{i}")))
            except (RlError, OSError):
                refused += 1
    finally:
        stop.set()
        thread.join()
        sys.setswitchinterval(interval)
    assert swaps[0] > 0
    assert snapshot(outside) == before
    store = LocalVolumeStore(run / "volumes", durable=False)
    for version in published:
        store.open(version.version).verify(deep=True)
    for ref in put:
        assert asyncio.run(LocalArtifacts(run / "artifacts").get(ref))


def test_a_tree_refuses_a_link_at_every_depth_and_acts_on_the_link_itself(tmp_path, outside):
    """The layer's own law: below the top a symlink is never followed, by any operation; unlink and rmtree remove the
    link, not its target."""
    top = tmp_path / "top"
    (top / "a").mkdir(parents=True)
    os.symlink(outside, top / "a" / "link")
    fs = Tree(top)
    before = snapshot(outside)
    for op in (
        lambda: fs.open_file(top / "a" / "link" / "file.txt", "w"),
        lambda: fs.read_bytes(top / "a" / "link" / "file.txt"),
        lambda: fs.mkdir(top / "a" / "link" / "new"),
        lambda: fs.write_atomic(top / "a" / "link" / "file.txt", b"x", tmp_name="t"),
        lambda: fs.rmtree(top / "a" / "link" / "staging"),
        lambda: fs.chmod(top / "a" / "link", 0o700),
        lambda: fs.listdir(top / "a" / "link"),
        lambda: list(fs.walk(top / "a" / "link")),
    ):
        with pytest.raises(LinkRefusedError, match="link"):
            op()
    fs.rmtree(top / "a")
    assert not os.path.lexists(top / "a")
    assert snapshot(outside) == before
