"""One writer per volume name: an flock on `locks/<name>.lock` (the kernel releases it when the writer dies), plus
an in-process set for filesystems (NFS) whose flock emulation does not conflict within one process."""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path

from rl.errors import WriterConflictError
from rl.platform import flock, unlock
from rl.storage.safe_fs import Tree

# Keyed by pid too: a child made by os.fork inherits this set but not the parent's writers.
OPEN_WRITERS: set[tuple[int, str, str]] = set()
OPEN_WRITERS_LOCK = threading.Lock()


def acquire_writer(root: Path, name: str) -> int:
    """Take the writer lock of volume `name` in the store at `root`; its fd. WriterConflictError if it is held."""
    key = (os.getpid(), str(root), name)
    with OPEN_WRITERS_LOCK:
        # The in-process set covers filesystems (NFS) whose flock emulation does not conflict within one process.
        if key in OPEN_WRITERS:
            raise WriterConflictError(conflict_message(name, os.getpid(), root))
        # Never through a symlink: a crafted `locks/<name>.lock` would have us truncate and write wherever it points.
        fd = Tree(root.parent).open(root / "locks" / f"{name}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            flock(fd, blocking=False)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise WriterConflictError(conflict_message(name, holder, root)) from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        OPEN_WRITERS.add(key)
    return fd


def release_writer(root: str, name: str, fd: int) -> None:
    with OPEN_WRITERS_LOCK:
        OPEN_WRITERS.discard((os.getpid(), root, name))
        with contextlib.suppress(OSError):
            unlock(fd)
        with contextlib.suppress(OSError):
            os.close(fd)


def conflict_message(name: str, holder: object, root: Path) -> str:
    return (
        f"volume {name!r} in {root} already has a writer (pid {holder}); each fork has exactly one writer. "
        f"Finalize or abandon that writer first, or fork under a different name"
    )
