"""`LocalWritableVolume`: one writer's private fork (or new volume), and how it finalizes into a version without
ever writing a file it shares with its parent."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import time
import uuid
import weakref
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, TYPE_CHECKING, Any

from rl.errors import InvalidPathError, SharedFileModifiedError, UnsupportedFileError, VolumeSealedError
from rl.storage.volumes.filesystem import WRITE_BITS, clean_relpath, read_only_mode
from rl.storage.volumes.manifest import FileEntry, new_manifest, symlink_target_problem
from rl.storage.volumes.writer_lock import release_writer

if TYPE_CHECKING:
    from rl.storage.volumes.store import LocalVolumeStore
    from rl.storage.volumes.version import LocalVolumeVersion


@dataclass(frozen=True)
class Inherited:
    """What a fork knew about a file it inherited, so finalize can reuse its digest, not re-read it."""

    ino: int
    size: int
    mtime_ns: int
    entry: FileEntry
    shares_parent_inode: bool


class LocalWritableVolume:
    """One writer's private fork (or new volume). Implements `rl.protocols.WritableVolume`.

    Files inherited from the parent are read-only in the mount; change them with `write_bytes`, `write_text`,
    `open_for_write` or `unshare`, which never touch the parent's bytes (see the module docstring). Use it as a context
    manager so an exception abandons it; after `finalize` or `abandon` every method raises VolumeSealedError.
    """

    def __init__(
        self,
        store: LocalVolumeStore,
        name: str,
        parent: LocalVolumeVersion | None,
        staging: Path,
        lock_fd: int,
        inherited: dict[str, Inherited],
        forked_at_ns: int,
    ) -> None:
        self._store = store
        self._name = name
        self._parent = parent
        self._staging = staging
        self._lock_fd = lock_fd
        self._inherited = inherited
        self._forked_at_ns = forked_at_ns
        self._closed: str | None = None
        # Dropping the object unfinalized acts like the writer dying: the lock goes, staging waits to be discarded.
        self._finalizer = weakref.finalize(self, release_writer, str(store.root), name, lock_fd)

    def __repr__(self) -> str:
        state = self._closed or "open"
        parent = self._parent.version[:12] if self._parent else None
        return f"<LocalWritableVolume {self._name!r} parent={parent} {state}>"

    def __enter__(self) -> LocalWritableVolume:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._closed is None:
            self.abandon()

    @property
    def name(self) -> str:
        return self._name

    @property
    def parent(self) -> LocalVolumeVersion | None:
        return self._parent

    @property
    def closed(self) -> bool:
        """True once finalized or abandoned."""
        return self._closed is not None

    def mount(self) -> Path:
        """The writable directory. Inherited files are read-only: write them through the helpers below."""
        self._check_open()
        return self._staging / "data"

    def write_bytes(self, relpath: str, data: bytes) -> Path:
        """Write a whole file by writing a new one and renaming it over `relpath`: a shared inode is never written."""
        self._check_open()
        path = self._path(relpath)
        fs = self._store.fs
        fs.mkdir(path.parent, parents=True, exist_ok=True)
        try:
            mode = 0o755 if fs.lstat(path).st_mode & 0o111 else 0o644
        except FileNotFoundError:
            mode = 0o644
        fs.write_atomic(path, data, tmp_name=f".{path.name}.tmp-{uuid.uuid4().hex[:8]}", perm=mode)
        return path

    def write_text(self, relpath: str, text: str, encoding: str = "utf-8") -> Path:
        return self.write_bytes(relpath, text.encode(encoding))

    def open_for_write(
        self, relpath: str, mode: str = "w", *, encoding: str | None = None, newline: str | None = None
    ) -> IO[Any]:
        """`open(mount() / relpath, mode)` for a writing mode ("w", "a", "x", "r+", "wb", ...), sharing broken first."""
        self._check_open()
        if not any(c in mode for c in "wax+"):
            raise InvalidPathError(
                f"open_for_write needs a writing mode, not {mode!r}; read files directly under mount()"
            )
        path = self._path(relpath)
        fs = self._store.fs
        fs.mkdir(path.parent, parents=True, exist_ok=True)
        if fs.kind(path) is not None:
            if "w" in mode:
                # Truncation would write the shared inode; a fresh file under the same name shares nothing.
                fs.unlink(path)
            elif "a" in mode or "+" in mode:
                self.unshare(relpath)
        return fs.open_file(path, mode, encoding=encoding, newline=newline, perm=0o644)

    def unshare(self, relpath: str) -> Path:
        """Make `relpath` a private writable file (a reflink where it can, else a copy); returns its path."""
        self._check_open()
        path = self._path(relpath)
        fs = self._store.fs
        st = fs.lstat(path)
        if not stat.S_ISREG(st.st_mode):
            raise InvalidPathError(
                f"{relpath!r} in volume {self._name!r} is not a regular file, so it cannot be unshared"
            )
        writable = stat.S_IMODE(st.st_mode) | 0o200
        if st.st_nlink > 1:
            tmp = path.with_name(f".{path.name}.unshare-{uuid.uuid4().hex[:8]}")
            try:
                fs.copy_file(path, tmp, reflink=self._store.share_mode == "reflink")
                fs.chmod(tmp, writable)
                fs.replace(tmp, path)
            except BaseException:
                fs.unlink(tmp, missing_ok=True)
                raise
        elif st.st_mode & 0o200 == 0:
            fs.chmod(path, writable)
        return path

    def delete(self, relpath: str) -> None:
        """Remove a file, symlink or directory tree from this fork (the parent keeps its copy)."""
        self._check_open()
        path = self._path(relpath)
        if self._store.fs.kind(path) is None:
            raise FileNotFoundError(f"{relpath!r} is not in volume {self._name!r}")
        self._store.fs.rmtree(path)

    def finalize(self, message: str) -> LocalVolumeVersion:
        """Seal the mount into an immutable version and publish it atomically; this writer is closed afterwards."""
        self._check_open()
        data = self._staging / "data"
        files, dirs, symlinks, stats = self._scan(data)
        tree = {"files": files, "dirs": dirs, "symlinks": symlinks}
        parent = self._parent.version if self._parent else None
        mtimes = {rel: st.st_mtime_ns for rel, st in stats.items()}
        manifest = new_manifest(self._name, parent, message, tree, published_at_ns=time.time_ns(), mtimes_ns=mtimes)
        version = manifest["version"]
        durable = self._store.durable
        fs = self._store.fs
        self._seal_modes(data, stats, dirs, durable=durable)
        body = json.dumps(manifest, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()  # json's C encoder
        fs.write_atomic(
            self._staging / "manifest.json", body, tmp_name=".manifest.json.tmp", perm=0o444, durable=durable
        )
        if durable:
            fs.fsync_dir(self._staging)
        target = self._store.root / "versions" / version
        published = True
        try:
            fs.rename(self._staging, target)
        except OSError as exc:
            if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY) or fs.kind(target / "manifest.json") != "file":
                raise
            # The same name, parent, message and files were published before (a retried task): that version is this one.
            fs.rmtree(self._staging)
            published = False
        if durable:
            fs.fsync_dir(target.parent)
            fs.fsync_dir(self._staging.parent)
        with contextlib.suppress(OSError):
            fs.chmod(target, 0o555)
        self._close(f"finalized as {version}")
        # Ours is known without reading it back; an earlier publication's is read (and checked) from disk.
        return self._store.adopt(body) if published else self._store.version(version)

    def abandon(self) -> None:
        """Discard everything written and release the name; nothing becomes visible."""
        self._check_open()
        self._store.fs.rmtree(self._staging)
        self._close("abandoned")

    def _close(self, state: str) -> None:
        self._closed = state
        self._finalizer()

    def _check_open(self) -> None:
        if self._closed is not None:
            raise VolumeSealedError(
                f"writable volume {self._name!r} was {self._closed}; it accepts no more writes. "
                f"Fork a finalized version (store.open(...).fork(name)) to write again"
            )

    def _path(self, relpath: str) -> Path:
        rel = clean_relpath(relpath)
        root = self._staging / "data"
        path = root
        for part in PurePosixPath(rel).parts[:-1]:
            path = path / part
            if path.is_symlink():
                raise InvalidPathError(
                    f"{relpath!r} goes through the symlink {path.relative_to(root)} in volume {self._name!r}; "
                    f"write to the real path instead, so a write cannot leave the mount"
                )
        return root / rel

    def _seal_modes(self, data: Path, stats: dict[str, os.stat_result], dirs: list[str], *, durable: bool) -> None:
        """Make the files `_scan` found (`stats`: each one's lstat then) and its `dirs` (sorted) read-only."""
        fs = self._store.fs
        for rel, st in stats.items():
            ro = read_only_mode(bool(st.st_mode & 0o111))
            # A shared inode is already read-only; leaving it alone keeps its ctime (and the parent's) untouched.
            if stat.S_IMODE(st.st_mode) != ro:
                fs.chmod(data / rel, ro)
        for d in [*(data / rel for rel in reversed(dirs)), data]:  # below before above: sorted puts a parent first
            if durable:
                fs.fsync_dir(d)
            fs.chmod(d, 0o555)

    def _scan(
        self, data: Path
    ) -> tuple[dict[str, dict[str, Any]], list[str], dict[str, str], dict[str, os.stat_result]]:
        """The mount's files (manifest entries), sorted dirs, symlinks, and each file's lstat."""
        files: dict[str, dict[str, Any]] = {}
        dirs: list[str] = []
        symlinks: dict[str, str] = {}
        stats: dict[str, os.stat_result] = {}
        fs = self._store.fs
        for rel, kind, st in fs.walk(data):
            if kind == "dir":
                dirs.append(rel)
            elif kind == "symlink":
                symlinks[rel] = fs.readlink(data / rel)
                problem = symlink_target_problem(rel, symlinks[rel])
                if problem:
                    raise InvalidPathError(
                        f"{problem} (volume {self._name!r}); a version's symlinks stay inside it, so a fork never "
                        f"reaches outside. Point it at a path inside the volume, or copy the target in, then finalize"
                    )
            elif kind == "file":
                files[rel] = self._file_entry(data, rel, st)
                stats[rel] = st
            else:
                raise UnsupportedFileError(
                    f"{rel} in volume {self._name!r} is a {kind}; a version holds only files, directories and "
                    f"symlinks. Delete it before finalizing"
                )
        return files, sorted(dirs), symlinks, stats

    def _file_entry(self, data: Path, rel: str, st: os.stat_result) -> dict[str, Any]:
        executable = bool(st.st_mode & 0o111)
        inh = self._inherited.get(rel)
        if (
            inh is not None
            and (st.st_ino, st.st_size, st.st_mtime_ns) == (inh.ino, inh.size, inh.mtime_ns)
            and not st.st_mode & WRITE_BITS
            and inh.mtime_ns < self._forked_at_ns - self._store.racy_ns
        ):
            return {"sha256": inh.entry.sha256, "size": inh.size, "executable": inh.entry.executable}
        # Still the parent's inode: its bytes were made durable when the parent was published, and if they changed
        # in place the check below refuses the fork; so only a file this writer created or unshared is fsynced. (A
        # parent published within the racy window is rehashed on every fork, as a fast loop's buffer is: the redundant
        # fsyncs were most of an iteration, docs/benchmarks.md.)
        inherited_inode = inh is not None and inh.shares_parent_inode and st.st_ino == inh.ino
        digest = self._store.fs.hash_file(data / rel, fsync=self._store.durable and not inherited_inode)
        if inh is not None and inh.shares_parent_inode and st.st_ino == inh.ino and digest != inh.entry.sha256:
            parent = self._parent.version if self._parent else "?"
            raise SharedFileModifiedError(
                f"{rel} in volume {self._name!r} was written in place while still a hard link to version {parent}, "
                f"so that version changed too and is now corrupt (a writer that bypasses file modes, such as root, "
                f"did it). Write inherited files through write_bytes/open_for_write/unshare, which break the link "
                f"first; abandon this fork and rebuild the damaged version"
            )
        return {"sha256": digest, "size": st.st_size, "executable": executable}
