"""One writer per run directory (issue 16, item 4): a second `rl demo grpo` or `rl rescore` on a directory another
process is writing exits non-zero with one line naming the holder, and touches nothing.

The holder is a real second process that takes the lock, says so on its stdout and waits on its stdin: the test
orders the two processes by that pipe, never by a sleep or a timeout.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from rl.errors import RunLockedError
from rl.storage.run_layout import MARKER, MARKER_TEXT
from rl.storage.run_lock import HOLDER_NAME, run_lock

_HOLD = (
    "import sys\n"
    "from pathlib import Path\n"
    "from rl.storage.run_lock import run_lock\n"
    "with run_lock(Path(sys.argv[1]), command='the holder'):\n"
    "    print('held', flush=True)\n"
    "    sys.stdin.read()\n"
)


@contextmanager
def _holder(run_dir: Path) -> Iterator[subprocess.Popen[str]]:
    """A child process holding `run_dir`'s lock until the block ends (its stdin closes)."""
    child = subprocess.Popen(
        [sys.executable, "-c", _HOLD, str(run_dir)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "held"
        yield child
    finally:
        if child.stdin is not None:
            child.stdin.close()
        child.wait()


def _rl(*args: str) -> subprocess.CompletedProcess[str]:
    code = f"import sys; from rl.cli import main; sys.exit(main({list(args)!r}))"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)


def _assert_names_the_holder(done: subprocess.CompletedProcess[str], child: subprocess.Popen[str]) -> None:
    assert done.returncode != 0
    # However the CLI prints a typed error (a traceback's last line, or the line alone), that line says it all.
    last = done.stderr.strip().splitlines()[-1]
    assert f"pid {child.pid} on host {socket.gethostname()} (the holder, since " in last, done.stderr
    assert "is being written by" in last and "use another directory" in last


@pytest.mark.slow  # a holder process and an `rl demo` process, each importing torch
def test_a_second_demo_on_a_directory_being_written_is_refused_naming_the_holder(tmp_path):
    out = tmp_path / "run"
    with _holder(out) as child:
        done = _rl("demo", "grpo", "--iterations", "1", "--prompts", "2", "--samples", "2", "--out", str(out))
        _assert_names_the_holder(done, child)
    assert sorted(p.name for p in out.iterdir()) == [".rl-writer.lock"]  # it wrote nothing


@pytest.mark.slow  # a holder process and an `rl demo --fresh` process, each importing torch
def test_fresh_never_deletes_a_directory_another_process_is_writing(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / MARKER).write_text(MARKER_TEXT)  # --fresh may delete here, but not while it is written
    (out / "checkpoint.json").write_text("the writer's")
    with _holder(out) as child:
        done = _rl("demo", "grpo", "--iterations", "1", "--out", str(out), "--fresh")
        _assert_names_the_holder(done, child)
        assert (out / "checkpoint.json").read_text() == "the writer's"


def test_rescore_of_a_directory_being_written_is_refused_naming_the_holder(tmp_path):
    (tmp_path / "volumes").mkdir()
    with _holder(tmp_path) as child:
        done = _rl("rescore", str(tmp_path), "--reward", "format")
        _assert_names_the_holder(done, child)
    assert list((tmp_path / "volumes").iterdir()) == []


def test_the_lock_is_free_once_its_holder_is_gone_even_by_sigkill(tmp_path):
    """The OS drops the lock of a killed process: no stale lock to clear by hand after a crash."""
    with _holder(tmp_path) as child:
        child.kill()
        child.wait()
    with run_lock(tmp_path, command="the next writer"):
        assert f'"pid": {os.getpid()}' in (tmp_path / HOLDER_NAME).read_text()
    assert not (tmp_path / HOLDER_NAME).exists()  # a clean exit leaves no holder record


def test_one_process_cannot_take_its_own_run_directory_twice(tmp_path):
    refused = pytest.raises(RunLockedError, match=f"pid {os.getpid()} .*first")
    with run_lock(tmp_path, command="first"), refused, run_lock(tmp_path, command="second"):
        pass
