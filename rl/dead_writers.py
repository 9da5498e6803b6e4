"""Temporary files and staging directories that say whether their writer is alive, so a later start can clean them.

A writer holds an flock on its temporary file or staging directory for as long as it writes there; the kernel drops
the lock when the writer dies (SIGKILL included), as with `LocalVolumeStore`'s writer locks. A cleaner deletes an entry
only when it can take that lock itself, so a live writer's temp file is never touched.

The race between creating an entry and locking it is closed from both sides: a writer that finds its path no longer
names the inode it locked (a cleaner removed it in between) makes a new one, and a cleaner removes only the inode it
locked. Where the filesystem cannot flock (some NFS mounts refuse it on directories), writers go on without the lock and
cleaners leave the entry alone: a stray temp file costs disk, deleting a live one would break a write.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

from rl.platform import flock


def lock_fd(fd: int, path: Path) -> bool:
    """Lock the new `path` (open as `fd`) for this writer; False when a cleaner removed it before the lock."""
    try:
        flock(fd)
    except OSError:
        return True  # no flock here: write unlocked (see the module docstring)
    try:
        return os.stat(path, follow_symlinks=False).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False


@contextlib.contextmanager
def locked_new_dir(make_path: Callable[[], Path]) -> Iterator[Path]:
    """A new directory at `make_path()` (a fresh name each call), locked while the block runs; it stays behind after."""
    while True:
        path = make_path()
        path.mkdir(parents=True)
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        if lock_fd(fd, path):
            break
        os.close(fd)
    try:
        yield path
    finally:
        os.close(fd)


def discard_if_dead(path: Path, remove: Callable[[Path], None] = shutil.rmtree) -> bool:
    """Delete `path` (with `remove` for a directory) if no live writer holds its lock; True if it was deleted."""
    if os.path.islink(path):
        path.unlink()  # not something a writer of ours makes; removing the link touches nothing it points at
        return True
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except FileNotFoundError:
        return False
    try:
        try:
            flock(fd, blocking=False)
        except OSError:
            return False  # a live writer holds it, or the filesystem cannot tell us: leave it
        try:
            if os.stat(path, follow_symlinks=False).st_ino != os.fstat(fd).st_ino:
                return False  # renamed away and replaced meanwhile: not the entry we locked
        except FileNotFoundError:
            return False
        if os.path.isdir(path):
            remove(path)
        else:
            path.unlink()
        return True
    finally:
        os.close(fd)
