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
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

from rl.platform import flock
from rl.storage.safe_fs import Tree, open_dir_at

Lock = Callable[..., None]  # `rl.platform.flock`'s signature: each function here takes one as `lock` (default flock)


def lock_at(fd: int, dir_fd: int, name: str, lock: Lock | None = None) -> bool:
    """Lock the new entry `name` of the held directory `dir_fd` (open as `fd`) for this writer; False when a cleaner
    removed it before the lock."""
    try:
        (lock or flock)(fd)
    except OSError:
        return True  # no flock here: write unlocked (see the module docstring)
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False


@contextlib.contextmanager
def locked_new_dir_at(dir_fd: int, make_name: Callable[[], str], lock: Lock | None = None) -> Iterator[tuple[str, int]]:
    """`locked_new_dir` in the held directory `dir_fd`: (its name, a descriptor of it), locked while the block runs."""
    while True:
        name = make_name()
        os.mkdir(name, dir_fd=dir_fd)
        try:
            fd = open_dir_at(dir_fd, name)
        except FileNotFoundError:
            continue  # a cleaner found it unlocked between the mkdir and the open, and removed it
        if lock_at(fd, dir_fd, name, lock):
            break
        os.close(fd)
    try:
        yield name, fd
    finally:
        os.close(fd)


@contextlib.contextmanager
def locked_new_dir(make_path: Callable[[], Path], fs: Tree, lock: Lock | None = None) -> Iterator[Path]:
    """A new directory at `make_path()` (a fresh name in one directory each call), locked while the block runs; it
    stays behind after."""
    parent = make_path().parent
    with fs.directory(parent) as dfd, locked_new_dir_at(dfd, lambda: make_path().name, lock) as (name, _):
        yield parent / name


def discard_if_dead(path: Path, fs: Tree, lock: Lock | None = None) -> bool:
    """Delete `path` (a file or a tree) if no live writer holds its lock; True if it was deleted."""
    kind = fs.kind(path)
    if kind is None:
        return False
    if kind == "symlink":
        fs.unlink(path)  # not something a writer of ours makes; removing the link touches nothing it points at
        return True
    try:
        # Non-blocking: a FIFO planted under a temp file's name must not hang the cleaner.
        fd = fs.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        return False
    try:
        try:
            (lock or flock)(fd, blocking=False)
        except OSError:
            return False  # a live writer holds it, or the filesystem cannot tell us: leave it
        try:
            if fs.lstat(path).st_ino != os.fstat(fd).st_ino:
                return False  # renamed away and replaced meanwhile: not the entry we locked
        except FileNotFoundError:
            return False
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            fs.rmtree(path)
        else:
            fs.unlink(path)
        return True
    finally:
        os.close(fd)
