"""What a run directory someone sent you cannot do (issue 39's classes): write through a hard link or a device, block a
read or a write on a FIFO or socket, size memory by a claimed number, or put escape sequences on a terminal. Each test
builds the attack by hand and checks the one layer every caller goes through (`rl.safe_fs.Tree`, `rl.errors.shown`)."""

from __future__ import annotations

import os
import signal
import socket
import stat
from pathlib import Path

import pytest

from rl.commands import failures
from rl.errors import UnsafeRunDirError, shown
from rl.safe_fs import Tree

WRITE_MODES = ["w", "a", "wb", "ab", "r+", "w+"]


class Hung(Exception):
    """An open blocked: the refusal this file tests did not come first."""


@pytest.fixture(autouse=True)
def deadline():  # type: ignore[no-untyped-def]
    """A test that blocks (a FIFO opened without O_NONBLOCK) fails after 20 s instead of hanging the session."""

    def hung(*_: object) -> None:
        raise Hung("blocked for 20 s")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(20)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    f = tmp_path / "outside.txt"
    f.write_text("precious\n")
    return f


@pytest.mark.parametrize("mode", WRITE_MODES)
def test_a_write_through_a_hard_link_is_refused_before_a_byte_changes(tmp_path: Path, outside: Path, mode: str) -> None:
    """docs/guarantees.md: "Every file the tool writes in a run directory is a regular file with one link": a hard
    link to a file outside, planted at metrics.jsonl, is refused and the outside file keeps its bytes."""
    run = tmp_path / "run"
    run.mkdir()
    os.link(outside, run / "metrics.jsonl")
    with pytest.raises(UnsafeRunDirError, match="2 hard links"):
        Tree(run).open_file(run / "metrics.jsonl", mode)
    assert outside.read_text() == "precious\n"


@pytest.mark.parametrize("flags", [os.O_WRONLY | os.O_CREAT | os.O_TRUNC, os.O_RDWR | os.O_CREAT])
def test_a_lock_file_hard_linked_outside_is_refused(tmp_path: Path, outside: Path, flags: int) -> None:
    """The lock files (`Tree.open` with O_RDWR, then truncated and written) go through the same check."""
    run = tmp_path / "run"
    run.mkdir()
    os.link(outside, run / ".rl-writer")
    with pytest.raises(UnsafeRunDirError):
        Tree(run).open(run / ".rl-writer", flags)
    assert outside.read_text() == "precious\n"


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _socket(path: Path) -> None:
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(path))
    s.close()  # the socket file stays; nothing listens


@pytest.mark.parametrize("make", [_fifo, _socket], ids=["fifo", "socket"])
@pytest.mark.parametrize("mode", ["r", "rb", *WRITE_MODES])
def test_a_fifo_or_socket_is_refused_without_blocking(tmp_path: Path, make, mode: str) -> None:  # type: ignore[no-untyped-def]
    """docs/guarantees.md: "A FIFO, socket or device where a file goes is refused before it can block": opening a FIFO
    with no writer (or no reader) would wait forever; here it is refused at once, for reading and for writing."""
    run = tmp_path / "run"
    run.mkdir()
    make(run / "report.html")
    with pytest.raises(UnsafeRunDirError, match="FIFO|socket"):
        Tree(run).open_file(run / "report.html", mode)


@pytest.mark.skipif(os.geteuid() != 0, reason="creating a device node needs root (mknod); not root here")
@pytest.mark.parametrize("mode", ["r", *WRITE_MODES])
def test_a_device_node_is_refused(tmp_path: Path, mode: str) -> None:
    run = tmp_path / "run"
    run.mkdir()
    os.mknod(run / "metrics.jsonl", stat.S_IFCHR | 0o666, os.makedev(1, 3))  # /dev/null's numbers
    with pytest.raises(UnsafeRunDirError, match="device"):
        Tree(run).open_file(run / "metrics.jsonl", mode)


def test_a_directory_where_a_file_goes_is_refused(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "checkpoint.json").mkdir(parents=True)
    with pytest.raises(UnsafeRunDirError, match="directory"):
        Tree(run).open_file(run / "checkpoint.json", "r")
    with pytest.raises(IsADirectoryError):
        Tree(run).open_file(run / "checkpoint.json", "w")


@pytest.mark.parametrize("mode", ["w", "a", "x"])
def test_an_ordinary_file_is_still_written(tmp_path: Path, mode: str) -> None:
    """The check refuses nothing this tool makes: a new file, or one it wrote before (truncated only by "w")."""
    Tree(tmp_path).open_file(tmp_path / "old", "w").close() if mode != "x" else None
    if mode != "x":
        (tmp_path / "old").write_text("old\n")
    with Tree(tmp_path).open_file(tmp_path / "old", mode) as f:
        f.write("new\n")
    assert (tmp_path / "old").read_text() == {"w": "new\n", "a": "old\nnew\n", "x": "new\n"}[mode]


HOSTILE = "ok\x1b]0;pwned\x07\x1b[2J\rall checks passed\u202e\udcff"


def test_shown_leaves_no_control_character_and_cuts_long_values() -> None:
    text = shown(HOSTILE + "x" * 1000)
    assert text.isprintable() and "\\x1b]0;pwned\\x07" in text and "\\u202e" in text and "\\udcff" in text
    assert len(text) < 300 and text.endswith("more characters)")
    assert shown("a\nb", keep="\n") == "a\nb"


def test_a_symlinked_checkpoint_whose_target_holds_escapes_prints_them_visibly(tmp_path: Path) -> None:
    """docs/guarantees.md: "A path or value read from a run directory reaches a terminal, a log or the report only
    through one escaping function": the error line of a crafted symlink shows its escape sequences as text."""
    from rl.run_layout import require_safe

    run = tmp_path / "run"
    run.mkdir()
    os.symlink(HOSTILE, run / "checkpoint.json")
    with pytest.raises(UnsafeRunDirError) as info:
        require_safe(run)
    line = failures.describe(info.value)
    assert line.isprintable() and "\\x1b]0;pwned" in line


def test_every_error_line_is_printable_whatever_raised_it() -> None:
    """The terminal's one sink (`rl.commands.failures`) escapes what a raiser forgot to."""
    for exc in (UnsafeRunDirError(HOSTILE), FileNotFoundError(2, "No such file", HOSTILE), ValueError(HOSTILE)):
        assert failures.describe(exc).isprintable(), exc


def test_a_sparse_file_in_an_artifact_is_refused_without_being_read_whole(tmp_path: Path) -> None:
    """docs/guarantees.md: "A file's size is checked against a limit, or the file streamed into its digest, before it
    is read": a stored adapter grown to a 64 MiB sparse file is refused (exit 4) with a few MiB of Python memory,
    where reading it whole before hashing took all 64."""
    import asyncio
    import tracemalloc

    from rl.artifacts import ArtifactCorruptError, LocalArtifacts

    store = LocalArtifacts(tmp_path / "artifacts")
    ref = asyncio.run(store.put({"adapter_model.safetensors": b"weights"}, name="adapter"))
    target = store.root / "objects" / ref.digest.removeprefix("sha256:") / "adapter_model.safetensors"
    os.chmod(target, 0o644)
    os.truncate(target, 64 << 20)
    tracemalloc.start()
    try:
        with pytest.raises(ArtifactCorruptError) as info:
            asyncio.run(store.get(ref))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert info.value.exit_code == 4
    assert peak < 16 << 20, f"peak {peak / 2**20:.0f} MiB"
