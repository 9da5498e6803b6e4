"""One writer per run directory: `rl demo grpo` and `rl rescore` hold an exclusive lock on the directory they write.

Two writers on one run directory race on its checkpoint (the later save wins, so the run can go backwards) and on its
buffer head. The lock is an `flock` on `RUN_DIR/.rl-writer.lock` (an OS lock: the kernel drops it when its process
dies, even by SIGKILL, so there is no stale lock to clear; `filelock.FileLock` where there is no flock). The holder also
writes who it is (pid, host, start time, command) to `RUN_DIR/.rl-writer.json`, so a second process can say whom it is
waiting for: the lock file itself must stay untouched by non-holders. Both files are opened without following links
(`rl.storage.safe_fs`): a run directory someone sent may hold a symlink under either name, or under the holder's temp
name.

Pure (no torch or flyte import): `rl rescore` takes it without loading the trainer.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from rl import platform
from rl.errors import RunDirError, RunLockedError, shown
from rl.storage.safe_fs import Tree

LOCK_NAME = ".rl-writer.lock"
HOLDER_NAME = ".rl-writer.json"
# What `--fresh` must leave in place while it holds the lock.
LOCK_FILES = frozenset({LOCK_NAME, HOLDER_NAME})


@contextmanager
def run_lock(run_dir: Path, *, command: str) -> Iterator[None]:
    """Hold the run directory's writer lock for the body (creating the directory); raise `RunLockedError` at once,
    naming the holder, when another process holds it."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    fs = Tree(run_dir)
    release = _acquire(fs, run_dir)
    if release is None:
        raise RunLockedError(
            f"{run_dir} is being written by {describe_holder(read_holder(run_dir))}; wait for it to finish or stop "
            "that process, or use another directory"
        )
    try:
        _write_holder(fs, run_dir, command)
        yield
    finally:
        try:
            fs.unlink(run_dir / HOLDER_NAME, missing_ok=True)
        finally:
            release()


def _acquire(fs: Tree, run_dir: Path) -> Callable[[], None] | None:
    """Take the lock without waiting: its release, or None when another process holds it."""
    if not platform.HAS_FLOCK:  # filelock's own lock (rl.platform refuses the platforms without flock today)
        lock = FileLock(run_dir / LOCK_NAME)
        try:
            lock.acquire(timeout=0)
        except Timeout:
            return None
        return lock.release
    fd = fs.open(run_dir / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        platform.flock(fd, blocking=False)
    except BlockingIOError:
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    return lambda: os.close(fd)  # closing the last descriptor drops the flock


def read_holder(run_dir: Path) -> dict[str, Any] | None:
    """The holder's record, or None when it is unreadable or not written yet (the holder is just starting)."""
    try:
        record = json.loads(Tree(run_dir).read_bytes(Path(run_dir) / HOLDER_NAME, limit=1 << 16).decode("utf-8"))
    except (OSError, OverflowError, RecursionError, ValueError, RunDirError):
        return None
    return record if isinstance(record, dict) else None


def describe_holder(record: dict[str, Any] | None) -> str:
    """`pid 123 on host h (rl demo grpo, since 2026-11-30 18:50:02 UTC)`, or what is known of it. Each field is
    shown through `rl.errors.shown` (escaped, cut to its limit): the record is a file anyone could have written."""
    if record is None:
        return "another process (it has not recorded its pid yet)"
    pid, host, command, started = (shown(record.get(key, "?")) for key in ("pid", "host", "command", "started"))
    return f"pid {pid} on host {host} ({command}, since {started})"


def _write_holder(fs: Tree, run_dir: Path, command: str) -> None:
    record = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "command": command,
    }
    # A reader sees the previous record or this one, never half of it.
    body = (json.dumps(record, allow_nan=False) + "\n").encode()
    fs.write_atomic(run_dir / HOLDER_NAME, body, tmp_name=f"{HOLDER_NAME}.{os.getpid()}.tmp")
