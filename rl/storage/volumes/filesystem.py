"""Filesystem primitives of the volume store: how a fork shares a file (reflink, hard link, copy), relative paths,
read-only modes and removing a sealed tree. Walking, sealing, hashing and durable writes go through
`rl.storage.safe_fs.Tree`.

Which filesystems get which sharing, and why: docs/volumes.md."""

from __future__ import annotations

import itertools
import os
import shutil
import uuid
from collections.abc import Sequence
from pathlib import Path, PurePosixPath
from typing import Literal

from rl import platform
from rl.errors import InvalidPathError

ShareMode = Literal["reflink", "hardlink", "copy"]
SHARE_MODES: tuple[ShareMode, ...] = ("reflink", "hardlink", "copy")

WRITE_BITS = 0o222

# The racy-clean window (git's "racy clean"): an inherited file whose mtime is this close to a fork could be rewritten
# in place without its mtime changing, so finalize re-hashes it. Sized per filesystem by `racy_window_ns`, within these
# bounds: 2 s is FAT's timestamp step, and no filesystem is trusted below 100 ms.
RACY_NS = 2_000_000_000
MIN_RACY_NS = 100_000_000
RACY_FACTOR = 8


def racy_window_ns(samples: Sequence[tuple[int, int]]) -> int:
    """The racy window for a filesystem from `samples`, (clock just before the write, the mtime it got) for fresh files
    written one after another: `RACY_FACTOR` times the larger of its timestamp step (the widest seen: a finely stamped
    file can fall between two coarse ones) and the most an mtime lagged the clock, within [MIN_RACY_NS, RACY_NS].
    Fewer than two steps seen means a step too coarse to measure: RACY_NS."""
    stamps = sorted({m for _, m in samples})
    if len(stamps) < 3:
        return RACY_NS
    step = max(b - a for a, b in itertools.pairwise(stamps))
    lag = max(t - m for t, m in samples)
    return min(RACY_NS, max(MIN_RACY_NS, RACY_FACTOR * max(step, lag)))


def probe_share_mode(directory: str | os.PathLike[str], cloner: platform.Cloner = platform.CLONER) -> ShareMode:
    """The cheapest sharing `directory`'s filesystem supports: "reflink" (by `cloner`), else "hardlink", else "copy"."""
    probe = Path(directory) / f".probe-{uuid.uuid4().hex}"
    probe.mkdir(parents=True)
    try:
        src = probe / "src"
        src.write_bytes(b"probe")
        if try_reflink(src, probe / "clone", cloner):
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


def read_only_mode(executable: bool) -> int:
    return 0o555 if executable else 0o444


def try_reflink(src: Path, dst: Path, cloner: platform.Cloner = platform.CLONER) -> bool:
    """Clone src's extents into a new file dst (rl.platform: FICLONE, clonefile); False, leaving no dst, where the
    platform or the filesystem cannot."""
    return platform.clone_file(src, dst, cloner)


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
