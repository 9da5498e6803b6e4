"""Local copy-on-write volumes: the packaged volume laws (`VolumeStoreContract`, its state machine extended with our
write helpers), then what only our store guarantees (share modes, sealed file modes, links, crashes in finalize)."""

from __future__ import annotations

import gc
import hashlib
import os
import shutil
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import invariant, rule

from rl.bench.volumes import bench_fork, format_bench
from rl.conformance import VolumeStoreContract
from rl.conformance.in_place_rewrite_laws import rewrite_in_place
from rl.conformance.volume_store_contract import PATHS, VolumeStoreMachine, read_tree
from rl.errors import (
    InvalidNameError,
    InvalidPathError,
    SharedFileModifiedError,
    UnsupportedFileError,
    VersionNotFoundError,
    VolumeCorruptedError,
    VolumeSealedError,
    WriterConflictError,
)
from rl.platform import bytes_written
from rl.storage.volumes import MIN_RACY_NS, RACY_NS, LocalVolumeStore, probe_share_mode, racy_window_ns

NOBODY = 65534


def force_rmtree(path: Path) -> None:
    """Remove a tree that holds sealed (0555) directories, as a non-root owner too."""
    for dirpath, _, _ in os.walk(path):
        os.chmod(dirpath, 0o700)
    shutil.rmtree(path)


def wchar() -> int:
    """Bytes this process passed to write-like syscalls (write, sendfile, copy_file_range): links add none."""
    written = bytes_written()
    assert written is not None, "only where the platform counts them (Linux's /proc/self/io)"
    return written


def in_child(fn: Callable[[], int]) -> int:
    """Run fn in a forked child that exits without any cleanup (as a crashed process would); return its exit code."""
    pid = os.fork()
    if pid == 0:
        code = 70
        try:
            code = fn()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


class LocalVolumeMachine(VolumeStoreMachine):
    """The contract's machine plus what only our store has: its write helpers (which break a hard link before writing),
    abandoning a writer by an exception in its `with` block, the conflict messages, and `verify()` of every version."""

    @rule(
        data=st.data(),
        path=st.sampled_from(PATHS),
        content=st.binary(max_size=32),
        how=st.sampled_from(["write_bytes", "open_w", "open_a", "unshare_r+"]),
    )
    def write_with_a_helper(self, data: st.DataObject, path: str, content: bytes, how: str) -> None:
        rw, model = self.open[self.pick_open(data)]
        if how == "write_bytes":
            rw.write_bytes(path, content)
            model[path] = content
        elif how == "open_w":
            with rw.open_for_write(path, "wb") as f:
                f.write(content)
            model[path] = content
        elif how == "open_a":
            with rw.open_for_write(path, "ab") as f:
                f.write(content)
            model[path] = model.get(path, b"") + content
        elif path in model:
            # Plain user code writing in place, after asking for a private copy.
            with open(rw.unshare(path), "r+b") as f:
                f.write(content)
            old = model[path]
            model[path] = content + old[len(content) :]

    @rule(data=st.data(), path=st.sampled_from(PATHS))
    def deleting_a_missing_file_raises(self, data: st.DataObject, path: str) -> None:
        rw, model = self.open[self.pick_open(data)]
        if path not in model and not (rw.mount() / path).is_dir():
            with pytest.raises(FileNotFoundError):
                rw.delete(path)

    @rule(data=st.data(), content=st.binary(min_size=1, max_size=32))
    def exception_mid_write_abandons(self, data: st.DataObject, content: bytes) -> None:
        name = self.pick_open(data)
        rw, _ = self.open.pop(name)
        with pytest.raises(RuntimeError, match="mid-write"), rw, rw.open_for_write("partial.bin", "wb") as f:
            f.write(content)
            raise RuntimeError("mid-write")
        assert rw.closed
        # The name is free again and nothing it wrote was published.
        self.store.new(name).abandon()

    @rule(data=st.data())
    def second_writer_gets_the_conflict_message(self, data: st.DataObject) -> None:
        name = self.pick_open(data)
        with pytest.raises(WriterConflictError, match="already has a writer"):
            self.store.new(name)
        version = data.draw(st.sampled_from(list(self.finalized)))
        with pytest.raises(WriterConflictError, match="exactly one writer"):
            self.store.open(version).fork(name)

    @invariant()
    def every_version_verifies(self) -> None:
        for version in self.finalized:
            self.store.open(version).verify()

    def teardown(self) -> None:
        for rw, _ in self.open.values():
            rw.abandon()
        self.open.clear()
        super().teardown()


class TestLocalVolumeStore(VolumeStoreContract):
    """Every volume law on our store, its state machine extended with the local-only rules above."""

    machine = LocalVolumeMachine

    @pytest.fixture
    def volume_store_factory(self, tmp_path: Path):
        return lambda: LocalVolumeStore(Path(tempfile.mkdtemp(dir=tmp_path)) / "store", durable=False)


@pytest.fixture
def store(tmp_path: Path) -> LocalVolumeStore:
    return LocalVolumeStore(tmp_path / "store")


def make_world(store: LocalVolumeStore, name: str = "world", files: dict[str, bytes] | None = None):
    rw = store.new(name)
    for rel, data in (files or {"docs/a.txt": b"alpha", "docs/b.txt": b"beta"}).items():
        rw.write_bytes(rel, data)
    return rw.finalize(f"build {name}")


@pytest.mark.parametrize("share", ["hardlink", "copy", "reflink"])
def test_a_forks_writes_are_invisible_to_its_parent_and_siblings_in_every_share_mode(tmp_path, share):
    """Whichever way files are shared, writes through the helpers change only the fork that made them."""
    if share == "reflink" and probe_share_mode(tmp_path) != "reflink":
        pytest.skip(f"{tmp_path}'s filesystem does not support reflinks")
    store = LocalVolumeStore(tmp_path / "store", share=share)
    world = make_world(store)
    one, two = world.fork("one"), world.fork("two")
    one.write_text("docs/a.txt", "changed")
    with one.open_for_write("docs/b.txt", "a") as f:
        f.write("+more")
    one.write_text("new.txt", "new")
    assert read_tree(two.mount()) == {"docs/a.txt": b"alpha", "docs/b.txt": b"beta"}
    assert read_tree(world.path()) == {"docs/a.txt": b"alpha", "docs/b.txt": b"beta"}
    v1 = one.finalize("one")
    two.delete("docs/a.txt")
    v2 = two.finalize("two")
    assert read_tree(v1.path()) == {"docs/a.txt": b"changed", "docs/b.txt": b"beta+more", "new.txt": b"new"}
    assert read_tree(v2.path()) == {"docs/b.txt": b"beta"}
    world.verify(deep=True)


@pytest.mark.parametrize("share", ["hardlink", "copy"])
@pytest.mark.parametrize("mode", ["w", "wb", "w+"])
def test_opening_an_inherited_file_to_truncate_leaves_the_parent_version_whole(tmp_path, share, mode):
    """open_for_write in a truncating mode gives the fork a new file: the inherited (shared) inode and so the parent
    version keep their bytes, whatever the share mode."""
    store = LocalVolumeStore(tmp_path / "store", share=share)
    world = make_world(store)
    fork = world.fork("fork")
    with fork.open_for_write("docs/a.txt", mode) as f:
        f.write(b"X" if "b" in mode else "X")
    assert read_tree(world.path()) == {"docs/a.txt": b"alpha", "docs/b.txt": b"beta"}
    assert read_tree(fork.finalize("fork").path())["docs/a.txt"] == b"X"
    world.verify(deep=True)


@pytest.mark.skipif(not os.path.exists("/proc/self/io"), reason="needs Linux's /proc/self/io to count bytes written")
@pytest.mark.skipif(bytes_written() is None, reason="this platform counts no written bytes (no /proc/self/io)")
@pytest.mark.parametrize("share", ["auto", "copy"])
def test_a_fork_of_a_large_file_copies_no_bytes_unless_the_store_must_copy(tmp_path, share):
    """Forking a 16 MiB world writes no bytes with links or reflinks (all of it with share="copy": the probe works)."""
    size = 16 << 20
    store = LocalVolumeStore(tmp_path / "store", share=share)
    world = make_world(store, files={"big.bin": os.urandom(size)})
    before = wchar()
    rw = world.fork("trial")
    written = wchar() - before
    parent_file, fork_file = world.path() / "big.bin", rw.mount() / "big.bin"
    if store.share_mode == "copy":
        assert written >= size
    else:
        assert written < 64 << 10, f"{store.share_mode} fork wrote {written} bytes"
    if store.share_mode == "hardlink":
        assert os.stat(parent_file).st_ino == os.stat(fork_file).st_ino
    rw.abandon()


def test_inherited_files_are_read_only_and_the_helpers_break_the_link(store):
    """Inherited files have no write bits; `unshare` gives a private writable file and the parent keeps its bytes."""
    world = make_world(store)
    rw = world.fork("trial")
    inherited = rw.mount() / "docs/a.txt"
    assert stat.S_IMODE(inherited.stat().st_mode) & 0o222 == 0
    path = rw.unshare("docs/a.txt")
    assert path.stat().st_mode & 0o200
    assert not os.path.samefile(path, world.path() / "docs/a.txt")
    path.write_text("mine")
    assert world.read_text("docs/a.txt") == "alpha"
    assert rw.finalize("t").read_text("docs/a.txt") == "mine"


def test_a_second_writer_is_refused_with_a_clear_error(store):
    """`fork(name)` or `new(name)` while `name` has an open writer raises WriterConflictError naming the fix."""
    world = make_world(store)
    rw = world.fork("trial")
    with pytest.raises(WriterConflictError) as err:
        world.fork("trial")
    assert "already has a writer" in str(err.value) and "Finalize or abandon" in str(err.value)
    with pytest.raises(WriterConflictError):
        store.new("trial")
    rw.finalize("done")
    world.fork("trial").abandon()  # free again once the first writer is done


def test_a_writer_in_another_process_is_refused(store):
    """The single-writer lock holds across processes, not just within one."""
    world = make_world(store)
    rw = world.fork("trial")

    def other_process() -> int:
        try:
            LocalVolumeStore(store.root).open(world.version).fork("trial")
        except WriterConflictError as exc:
            return 0 if f"pid {os.getppid()}" in str(exc) else 2
        return 1

    assert in_child(other_process) == 0
    rw.abandon()


def test_a_finalized_writer_refuses_every_write(store):
    """After finalize (or abandon) the writable volume raises VolumeSealedError instead of writing anything."""
    rw = store.new("world")
    rw.write_text("a.txt", "a")
    version = rw.finalize("sealed")
    for call in (rw.mount, lambda: rw.write_text("b.txt", "b"), lambda: rw.open_for_write("a.txt"), rw.abandon):
        with pytest.raises(VolumeSealedError, match=f"finalized as {version.version}"):
            call()
    other = store.new("other")
    other.abandon()
    with pytest.raises(VolumeSealedError, match="abandoned"):
        other.finalize("too late")


def test_a_finalized_version_is_read_only_on_disk(tmp_path):
    """Sealed files and directories have no write bits, so an unprivileged writer gets PermissionError."""
    # A world-traversable root, so a child that dropped root's privileges can reach the files.
    base = Path(tempfile.mkdtemp(prefix="rl-volumes-ro-"))
    try:
        os.chmod(base, 0o755)
        store = LocalVolumeStore(base / "store")
        world = make_world(store)
        fork_dir = world.fork("trial").mount()
        for path in [world.path(), *world.path().rglob("*")]:
            assert stat.S_IMODE(path.stat().st_mode) & 0o222 == 0, path

        def unprivileged_writes() -> int:
            if os.geteuid() == 0:
                os.setgid(NOBODY)
                os.setuid(NOBODY)
            refused = 0
            for path, mode in (
                (world.path() / "docs/a.txt", "r+b"),
                (world.path() / "docs/new.txt", "wb"),
                (fork_dir / "docs/a.txt", "ab"),
            ):
                try:
                    with open(path, mode):
                        pass
                except PermissionError:
                    refused += 1
            return 0 if refused == 3 else 1

        assert in_child(unprivileged_writes) == 0
        assert world.read_text("docs/a.txt") == "alpha"
        world.verify(deep=True)
    finally:
        force_rmtree(base)


def test_writing_a_sealed_version_behind_the_stores_back_is_detected(store):
    """A writer that bypasses modes (root, an owner's chmod) is caught by verify; fork refuses the damaged version."""
    world = make_world(store)
    victim = world.path() / "docs/a.txt"
    os.chmod(victim, 0o644)
    with open(victim, "ab") as f:
        f.write(b" tampered")
    with pytest.raises(VolumeCorruptedError, match=r"docs/a\.txt"):
        world.verify()
    with pytest.raises(VolumeCorruptedError, match="modified after it was finalized"):
        world.fork("trial")
    store.new("trial").abandon()  # the refused fork released its name


@pytest.mark.skipif(probe_share_mode(tempfile.gettempdir()) != "hardlink", reason="only hard links share an inode")
def test_an_in_place_write_to_a_shared_inode_is_refused_at_finalize(tmp_path):
    """Root writing an inherited hard link in place corrupts the parent; finalize says so instead of sealing it."""
    store = LocalVolumeStore(tmp_path / "store", share="hardlink")
    world = make_world(store)
    rw = world.fork("trial")
    shared = rw.mount() / "docs/a.txt"
    os.chmod(shared, 0o644)  # what root's CAP_DAC_OVERRIDE amounts to
    with open(shared, "r+b") as f:
        f.write(b"ALPHA")  # same size: only the bytes tell
    with pytest.raises(SharedFileModifiedError, match="written in place"):
        rw.finalize("trial")
    rw.abandon()
    with pytest.raises(VolumeCorruptedError):
        world.verify()


@pytest.mark.parametrize("share", ["copy", "reflink"])
def test_a_forks_own_copy_rewritten_in_place_within_the_racy_window_is_hashed_again(tmp_path, share):
    """A fork's copy keeps its parent's mtime, so a rewrite in place within one timestamp step (root's, or a copy made
    writable) changes neither its inode, size nor mtime: only the racy window has it read again, into the new bytes'
    digest; deep verify agrees."""
    if share == "reflink" and probe_share_mode(tmp_path) != "reflink":
        pytest.skip(f"{tmp_path}'s filesystem does not support reflinks")
    store = LocalVolumeStore(tmp_path / "store", share=share)
    first = store.new("buf")
    young = first.write_bytes("iter-0.jsonl", b"reward 0.25\n")
    future = os.stat(young).st_mtime_ns + 10 * store.racy_ns  # inside the window however long the test takes
    os.utime(young, ns=(future, future))
    parent = first.finalize("v1")
    rw = parent.fork("buf")
    rewrite_in_place(rw.mount() / "iter-0.jsonl", b"reward 0.75\n")
    child = rw.finalize("v2")
    assert child.files["iter-0.jsonl"].sha256 == hashlib.sha256(b"reward 0.75\n").hexdigest()
    assert child.content_digest != parent.content_digest
    child.verify(deep=True)
    parent.verify(deep=True)


def test_a_crash_between_writing_and_finalizing_leaves_no_version(store):
    """A process killed after writing but before finalizing publishes nothing; the name's next writer starts clean."""
    world = make_world(store)
    before = store.versions()

    def crash() -> int:
        rw = LocalVolumeStore(store.root).open(world.version).fork("trial")
        rw.write_text("docs/a.txt", "uncommitted")
        with open(rw.mount() / "torn.bin", "wb") as f:
            f.write(b"half")
            os._exit(0)  # the kill: no finalize, no abandon, no cleanup
        return 1

    assert in_child(crash) == 0
    assert store.versions() == before
    assert (store.root / "staging" / "trial").exists()
    rw = world.fork("trial")
    assert read_tree(rw.mount()) == read_tree(world.path())
    rw.abandon()


def test_a_crash_inside_finalize_before_publishing_leaves_no_version(store, monkeypatch):
    """If finalize dies just before its publishing rename, no version (not even a partial one) is listed."""
    world = make_world(store)

    def power_loss(*args, **kwargs):
        raise OSError("simulated crash before publish")

    with pytest.raises(OSError, match="simulated crash"), world.fork("trial") as rw:
        rw.write_text("new.txt", "x" * 1000)
        monkeypatch.setattr(os, "rename", power_loss)
        rw.finalize("never published")
    monkeypatch.undo()
    assert store.versions() == [world]
    assert not (store.root / "staging" / "trial").exists()


def test_discard_abandoned_removes_dead_writers_only(store):
    """Staging left by a dead writer is discarded; a live writer's staging is kept."""
    world = make_world(store)
    live = world.fork("live")
    dead = world.fork("dead")
    dead.write_text("x", "x")
    del dead
    gc.collect()
    assert store.discard_abandoned() == ["dead"]
    assert live.mount().exists()
    live.abandon()


def test_every_version_stays_addressable(store):
    """A version opens by id, unique prefix, or name (latest); unknown keys say what exists."""
    v1 = make_world(store, "buf", {"iter-1": b"1"})
    rw = v1.fork("buf")
    rw.write_bytes("iter-2", b"2")
    v2 = rw.finalize("second")
    assert store.open(v1.version) == v1
    assert store.open(v2.version[:10]) == v2
    assert store.open("buf") == v2
    assert store.versions("buf") == [v1, v2]
    assert v2.parent == v1.version and v1.parent is None
    assert read_tree(v1.path()) == {"iter-1": b"1"}
    with pytest.raises(VersionNotFoundError, match="buf"):
        store.open("nope")


def test_finalizing_the_same_content_twice_returns_the_same_version(store):
    """Versions are content-addressed: a retried build (same name, parent, message, files) is the published version."""
    first = make_world(store)
    second = make_world(store)
    assert first == second and len(store.versions()) == 1
    fork = first.fork("other")
    assert fork.finalize("build world").content_digest == first.content_digest


@pytest.mark.parametrize("bad", ["", "../x", "a/../../x", "/etc/passwd", "."])
def test_paths_outside_the_mount_are_refused(store, bad):
    """Helpers refuse absolute paths and '..' rather than writing outside the volume."""
    with store.new("world") as rw, pytest.raises(InvalidPathError):
        rw.write_text(bad, "x")


def test_a_symlink_cannot_carry_a_write_out_of_the_mount(store, tmp_path):
    """A symlinked directory inside the mount is not followed by the helpers."""
    outside = tmp_path / "outside"
    outside.mkdir()
    with store.new("world") as rw:
        os.symlink(outside, rw.mount() / "link")
        with pytest.raises(InvalidPathError, match="symlink"):
            rw.write_text("link/escape.txt", "x")
    assert list(outside.iterdir()) == []


@pytest.mark.parametrize("bad", ["", ".hidden", "a/b", "x" * 201, "0" * 64])
def test_invalid_names_are_refused(store, bad):
    """Names must be safe directory names and not look like version ids."""
    with pytest.raises(InvalidNameError):
        store.new(bad)


def test_symlinks_executables_and_empty_directories_survive_fork_and_finalize(store):
    """A world is more than regular files: modes, links and empty directories round-trip through a fork."""
    rw = store.new("world")
    rw.write_text("bin/run.sh", "#!/bin/sh\necho hi\n")
    os.chmod(rw.mount() / "bin/run.sh", 0o755)
    os.symlink("bin/run.sh", rw.mount() / "run")
    (rw.mount() / "workspace").mkdir()
    world = rw.finalize("world")
    assert world.files["bin/run.sh"].executable and world.symlinks == {"run": "bin/run.sh"}
    child = world.fork("trial").finalize("trial")
    assert child.content_digest == world.content_digest
    assert (child.path() / "workspace").is_dir() and os.readlink(child.path() / "run") == "bin/run.sh"
    assert os.stat(child.path() / "bin/run.sh").st_mode & 0o111


def test_a_fifo_in_the_mount_is_refused_at_finalize(store):
    """A version holds files, directories and symlinks; anything else is named in the error."""
    with store.new("world") as rw:
        os.mkfifo(rw.mount() / "pipe")
        with pytest.raises(UnsupportedFileError, match=r"pipe in volume 'world' is a FIFO"):
            rw.finalize("x")


@pytest.mark.skipif(not os.path.exists("/proc/self/io"), reason="needs Linux's /proc/self/io to count bytes written")
def test_bench_fork_measures_a_fork_against_a_full_copy(tmp_path):
    """The benchmark runs end to end at a small size, counts the copy's bytes, and leaves nothing behind."""
    result = bench_fork(4 << 20, directory=tmp_path, file_bytes=256 << 10, settle_s=0)
    assert result["files"] == 16 and result["copy_bytes_written"] >= 4 << 20
    if result["share_mode"] != "copy":
        assert result["fork_bytes_written"] < 4096
    assert "fork vs copy" in format_bench(result)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(probe_share_mode(tempfile.gettempdir()) != "hardlink", reason="only hard links share an inode")
def test_a_fork_of_a_fresh_version_fsyncs_only_the_files_it_wrote(tmp_path, monkeypatch):
    """A version published a moment ago is inside the racy window, so its files are rehashed at the fork's finalize;
    they were made durable when it was published, so only the file the fork wrote is fsynced again (a fast loop's
    buffer once fsynced its last two seconds of iterations on every append)."""
    store = LocalVolumeStore(tmp_path / "store", share="hardlink", durable=True)
    first = store.new("buf")
    for i in range(3):
        first.write_bytes(f"iter-{i}.jsonl", b"row\n" * (i + 1))
    parent = first.finalize("v1")
    synced: list[str] = []
    real = store.fs.hash_file

    def spy(path: Path, *, fsync: bool = False) -> str:
        if fsync:
            synced.append(Path(path).name)
        return real(path, fsync=fsync)

    monkeypatch.setattr(store.fs, "hash_file", spy)
    child = parent.fork("buf")
    child.write_bytes("iter-3.jsonl", b"new\n")
    version = child.finalize("v2")
    assert synced == ["iter-3.jsonl"]
    assert version.read_bytes("iter-0.jsonl") == b"row\n"


def test_the_racy_window_is_sized_from_the_timestamps_the_filesystem_gave():
    """Eight times the larger of the timestamp step and the clock's lead over an mtime, kept within [100 ms, 2 s]; a
    step too coarse to see twice in the probe (FAT's 2 s) gets the ceiling."""
    ms = 1_000_000
    jiffies = [(t * ms + 2 * ms, (t // 4) * 4 * ms) for t in range(12)]  # 4 ms steps, the clock up to 5 ms ahead
    assert racy_window_ns(jiffies) == MIN_RACY_NS
    coarse = [(t * 20 * ms, (t // 3) * 60 * ms) for t in range(9)]  # 60 ms steps: 8 x 60 ms
    assert racy_window_ns(coarse) == 480 * ms
    fine_between = [*coarse, (61 * ms, 60 * ms + 17_935)]  # a multigrain kernel's fine stamp between two coarse ones
    assert racy_window_ns(fine_between) == 480 * ms
    assert racy_window_ns([(t * ms, 0) for t in range(25)]) == RACY_NS  # one stamp for the whole probe
    assert racy_window_ns([(0, 0), (ms, 0), (1000 * ms, 1000 * ms)]) == RACY_NS  # one step seen: not measured
    assert racy_window_ns([(0, 0), (1, 1_000 * ms), (2, 2_000 * ms)]) == RACY_NS  # 1 s steps: the ceiling


def test_the_store_probes_a_window_within_the_bounds(store):
    """The probe runs on the store's own filesystem and leaves nothing in staging."""
    assert MIN_RACY_NS <= store.racy_ns <= RACY_NS
    assert not any(store.fs.listdir(store.root / "staging"))


@pytest.mark.skipif(probe_share_mode(tempfile.gettempdir()) != "hardlink", reason="only hard links share an inode")
def test_a_fork_rehashes_only_the_files_younger_than_the_racy_window(tmp_path, monkeypatch):
    """A file whose mtime is older than the window is trusted from its stat; one inside it is read again, so an
    in-place rewrite that kept its size, mode and mtime is still caught (git's racy clean)."""
    store = LocalVolumeStore(tmp_path / "store", share="hardlink")
    first = store.new("buf")
    old = first.write_bytes("old.jsonl", b"old row\n")
    young = first.write_bytes("young.jsonl", b"young row\n")
    # Stamped well before and well after now, so how long the test takes cannot move either across the window.
    past, future = (os.stat(old).st_mtime_ns + k * 10 * store.racy_ns for k in (-1, 1))
    os.utime(old, ns=(past, past))
    os.utime(young, ns=(future, future))
    parent = first.finalize("v1")
    hashed: list[str] = []
    real = store.fs.hash_file
    monkeypatch.setattr(store.fs, "hash_file", lambda path, **kw: hashed.append(Path(path).name) or real(path, **kw))
    with parent.fork("buf") as child:
        child.write_bytes("new.jsonl", b"new\n")
        child.finalize("v2")
    assert sorted(hashed) == ["new.jsonl", "young.jsonl"]

    rw = parent.fork("buf")
    young = rw.mount() / "young.jsonl"
    st_before = os.stat(young)
    os.chmod(young, 0o644)  # root's in-place write, its traces then put back
    with open(young, "r+b") as f:
        f.write(b"YOUNG")
    os.chmod(young, stat.S_IMODE(st_before.st_mode))
    os.utime(young, ns=(st_before.st_atime_ns, st_before.st_mtime_ns))
    with pytest.raises(SharedFileModifiedError, match="written in place"):
        rw.finalize("v3")
    rw.abandon()


def test_a_store_given_its_racy_window_keeps_it(tmp_path):
    """A racy window passed in is the store's own, whatever this filesystem's probe would say."""
    store = LocalVolumeStore(tmp_path / "store", racy_ns=RACY_NS + 1)
    assert store.racy_ns == RACY_NS + 1  # outside what a probe returns
