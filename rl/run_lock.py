"""One writer per run directory: `rl demo grpo` and `rl rescore` hold an exclusive lock on the directory they write.

Two writers on one run directory race on its checkpoint (the later save wins, so the run can go backwards) and on its
buffer head. The lock is `filelock.FileLock` on `RUN_DIR/.rl-writer.lock` (an OS lock, `flock` on POSIX: the kernel
drops it when its process dies, even by SIGKILL, so there is no stale lock to clear). The holder also writes who it is
(pid, host, start time, command) to `RUN_DIR/.rl-writer.json`, so a second process can say whom it is waiting for:
filelock keeps no owner record for a native lock, and the lock file itself must stay untouched by non-holders.

Pure (no torch or flyte import): `rl rescore` takes it without loading the trainer.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from rl.errors import RunLockedError

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
    lock = FileLock(run_dir / LOCK_NAME)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        raise RunLockedError(
            f"{run_dir} is being written by {describe_holder(read_holder(run_dir))}; wait for it to finish or stop "
            "that process, or use another directory"
        ) from None
    try:
        _write_holder(run_dir, command)
        yield
    finally:
        try:
            (run_dir / HOLDER_NAME).unlink(missing_ok=True)
        finally:
            lock.release()


def read_holder(run_dir: Path) -> dict[str, Any] | None:
    """The holder's record, or None when it is unreadable or not written yet (the holder is just starting)."""
    try:
        record = json.loads((Path(run_dir) / HOLDER_NAME).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return record if isinstance(record, dict) else None


def describe_holder(record: dict[str, Any] | None) -> str:
    """`pid 123 on host h (rl demo grpo, since 2026-11-30 18:50:02 UTC)`, or what is known of it."""
    if record is None:
        return "another process (it has not recorded its pid yet)"
    return (
        f"pid {record.get('pid', '?')} on host {record.get('host', '?')} "
        f"({record.get('command', '?')}, since {record.get('started', '?')})"
    )


def _write_holder(run_dir: Path, command: str) -> None:
    record = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "command": command,
    }
    # A reader sees the previous record or this one, never half of it.
    tmp = run_dir / f"{HOLDER_NAME}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(record, allow_nan=False) + "\n", encoding="utf-8")
    os.replace(tmp, run_dir / HOLDER_NAME)
