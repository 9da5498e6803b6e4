"""Filesystem primitives of the volume store: how a fork shares a file (reflink, hard link, copy), walking a tree
without following symlinks, sealing it read-only, hashing, durable writes and removing a sealed tree.

Which filesystems get which sharing, and why: docs/volumes.md."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import uuid
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from rl import platform
from rl.volumes.errors import InvalidPathError

ShareMode = Literal["reflink", "hardlink", "copy"]
SHARE_MODES: tuple[ShareMode, ...] = ("reflink", "hardlink", "copy")

WRITE_BITS = 0o222


def probe_share_mode(directory: str | os.PathLike[str]) -> ShareMode:
    """The cheapest sharing `directory`'s filesystem supports: "reflink", else "hardlink", else "copy"."""
    probe = Path(directory) / f".probe-{uuid.uuid4().hex}"
    probe.mkdir(parents=True)
    try:
        src = probe / "src"
        src.write_bytes(b"probe")
        if try_reflink(src, probe / "clone"):
            return "reflink"
        try:
            os.link(src, probe / "link")
        except OSError:
            return "copy"
        return "hardlink"
    finally:
        shutil.rmtree(probe, ignore_errors=True)


def clean_relpath(relpath: str | os.PathLike[str]) -> str:
    rel = PurePosixPath(os.fspath(relpath))
    if rel.is_absolute() or not rel.parts or ".." in rel.parts or rel == PurePosixPath("."):
        raise InvalidPathError(f"{os.fspath(relpath)!r} must be a relative path inside the volume, without '..'")
    return rel.as_posix()


def walk(root: Path, prefix: str = "") -> Iterator[tuple[str, str, os.stat_result]]:
    """(relpath, kind, lstat) for everything under root, sorted, never following symlinks."""
    with os.scandir(root) as it:
        entries = sorted(it, key=lambda e: e.name)
    for entry in entries:
        rel = f"{prefix}{entry.name}"
        st = entry.stat(follow_symlinks=False)
        if stat.S_ISLNK(st.st_mode):
            yield rel, "symlink", st
        elif stat.S_ISDIR(st.st_mode):
            yield rel, "dir", st
            yield from walk(Path(entry.path), f"{rel}/")
        elif stat.S_ISREG(st.st_mode):
            yield rel, "file", st
        else:
            yield rel, special_kind(st.st_mode), st


def special_kind(mode: int) -> str:
    for test, kind in ((stat.S_ISFIFO, "FIFO"), (stat.S_ISSOCK, "socket"), (stat.S_ISCHR, "character device")):
        if test(mode):
            return kind
    return "block device" if stat.S_ISBLK(mode) else "special file"


def read_only_mode(executable: bool) -> int:
    return 0o555 if executable else 0o444


def seal_modes(data: Path, *, durable: bool) -> None:
    dirs = [data]
    for rel, kind, st in walk(data):
        path = data / rel
        if kind == "file":
            ro = read_only_mode(bool(st.st_mode & 0o111))
            # A shared inode is already read-only; leaving it alone keeps its ctime (and the parent's) untouched.
            if stat.S_IMODE(st.st_mode) != ro:
                os.chmod(path, ro)
        elif kind == "dir":
            dirs.append(path)
    for d in reversed(dirs):
        if durable:
            fsync_dir(d)
        os.chmod(d, 0o555)


def try_reflink(src: Path, dst: Path) -> bool:
    """Clone src's extents into a new file dst (rl.platform: FICLONE, clonefile); False, leaving no dst, where the
    platform or the filesystem cannot."""
    return platform.clone_file(src, dst)


def hash_file(path: Path, *, fsync: bool) -> str:
    with open(path, "rb") as f:
        digest = hashlib.file_digest(f, "sha256").hexdigest()
        if fsync:
            os.fsync(f.fileno())
    return digest


def write_json(path: Path, obj: Any, *, durable: bool) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, sort_keys=True, indent=1, allow_nan=False)
        if durable:
            f.flush()
            os.fsync(f.fileno())
    os.chmod(tmp, 0o444)
    os.replace(tmp, path)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def force_rmtree(path: Path) -> None:
    """rmtree that also works on sealed (0555) trees for a non-root owner; never follows symlinks."""
    if not os.path.lexists(path):
        return
    if path.is_dir() and not path.is_symlink():
        os.chmod(path, 0o700)
        for dirpath, dirnames, _ in os.walk(path):
            for d in dirnames:
                sub = os.path.join(dirpath, d)
                if not os.path.islink(sub):
                    os.chmod(sub, 0o700)
        shutil.rmtree(path)
    else:
        os.unlink(path)
