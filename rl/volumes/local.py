"""Versioned copy-on-write volumes on a local filesystem: the `Volume` / `ROVolume` of seeds 000 and 002, as folders.

A `LocalVolumeStore` keeps, under its root:

    versions/<version>/manifest.json   name, parent, message, and the digest, size and mode of every file
    versions/<version>/data/           the files: read-only (files 0444 or 0555, directories 0555), never changed again
    staging/<name>/data/               the mount of the open writable volume `name`, private until it is finalized
    locks/<name>.lock                  the flock its one writer holds

Sharing. A fork gets its parent's files without copying their bytes, by the best mechanism the store's filesystem
offers, probed once when the store opens (`LocalVolumeStore.share_mode`, `probe_share_mode`):

- "reflink" (FICLONE ioctl): the fork's file is a new inode sharing the parent's extents; the filesystem copies a block
  only when one side writes it. True copy-on-write: btrfs, XFS formatted with reflink=1 (the mkfs.xfs default since
  xfsprogs 5.1), bcachefs, OCFS2, and OpenZFS >= 2.2 where block cloning is enabled.
- "hardlink" (os.link): the fork's file *is* the parent's inode, so copy-on-write is done by this module (below). ext4
  (measured: the project's development machine's /tmp is ext4 and gets this), tmpfs, NFS, overlayfs upper layers, and
  APFS on macOS (whose clonefile(2) the standard library does not expose). A file that cannot be linked (the link
  limit, 65,000 on ext4; fs.protected_hardlinks on another user's file) is copied.
- "copy": a full byte copy, for filesystems without hard links (FAT, exFAT, some FUSE and SMB mounts): correct, but a
  fork then costs as much as its parent weighs.

`os.copy_file_range` is not used: it reflinks on btrfs and XFS but silently falls back to an in-kernel byte copy
elsewhere (ext4), so it cannot promise that a fork copies nothing; the FICLONE ioctl either shares extents or fails.

How copy-on-write holds when arbitrary user code writes into the mount. Every file a fork inherits is read-only (0444,
or 0555 when executable) in every share mode, so writing it in place (`open(p, "w")`, `"a"`, `"r+"`) fails loudly with
PermissionError instead of changing the parent's inode. To change an inherited file, write through the writable volume:
`write_bytes` / `write_text` (write a new file, rename it over the old name), `open_for_write` (breaks the link first)
or `unshare` (a private writable copy in place, a reflink where the filesystem can). Replacing a file by rename and
deleting it are always safe: they change only directory entries, and every directory in a fork is the fork's own. New
files the user creates are ordinary writable files.

The limit: a process that bypasses file modes (root, or anything with CAP_DAC_OVERRIDE) can still write a hard-linked
file in place. On "reflink" and "copy" that is harmless (the fork's inode is its own); on "hardlink" it changes the
parent. This module detects it but cannot undo it: `finalize` refuses a fork whose inherited file changed while still
sharing its parent's inode (`SharedFileModifiedError`), `fork` refuses a parent whose files no longer match their
manifest (`VolumeCorruptedError`) and `verify(deep=True)` re-hashes a version. Run untrusted code (an agent's shell) as
an unprivileged user, or give it a store opened with share="copy" where reflinks are not available.

Crash safety. A writable volume lives in staging/<name>/ until `finalize` hashes it, seals its modes, writes its
manifest, fsyncs and publishes it with one rename(2) into versions/. A crash before that rename leaves only a staging
directory, which is never listed and which the next writer of that name (or `discard_abandoned`) deletes; a crash after
it leaves a complete version. The writer lock is an flock, so the kernel releases it when the writer dies.

Versions are content-addressed: `version` is the sha256 of (name, parent, message, content digest) and the content
digest the sha256 of the file tree, so finalizing the same content twice (a retried task) returns the same version.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import re
import shutil
import stat
import sys
import threading
import time
import uuid
import weakref
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, Any, Literal

from rl.errors import RlError
from rl.types import ArtifactRef
from rl.volumes.manifest import MANIFEST_FORMAT, manifest_problem, symlink_target_problem
from rl.volumes.manifest import digest as _digest

ShareMode = Literal["reflink", "hardlink", "copy"]
SHARE_MODES: tuple[ShareMode, ...] = ("reflink", "hardlink", "copy")

# fcntl.FICLONE exists only from Python 3.12; this is Linux's _IOW(0x94, 9, int).
_FICLONE = getattr(fcntl, "FICLONE", 0x40049409)
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")
_VERSION_RE = re.compile(r"[0-9a-f]{64}")
_MIN_PREFIX = 8
# A write sets mtime to "now" at the filesystem's timestamp granularity (a jiffy on ext4, 2 s on FAT). An inherited file
# whose mtime is this close to the fork could have been rewritten without its mtime changing, so finalize re-hashes it
# (git's "racy clean").
_RACY_NS = 2_000_000_000
_WRITE_BITS = 0o222

# Keyed by pid too: a child made by os.fork inherits this set but not the parent's writers.
_OPEN_WRITERS: set[tuple[int, str, str]] = set()
_OPEN_WRITERS_LOCK = threading.Lock()


class VolumeError(RlError):
    """Base class of every error the volume layer raises."""

    exit_code = 5


class InvalidNameError(VolumeError, ValueError):
    """A volume name that cannot name a directory safely."""


class InvalidPathError(VolumeError, ValueError):
    """A path that escapes the mount, or names something a helper cannot write."""


class WriterConflictError(VolumeError):
    """A second writer for a volume name that already has one open."""


class VolumeSealedError(VolumeError):
    """A write through a writable volume that was already finalized or abandoned."""


class VersionNotFoundError(VolumeError, LookupError):
    """No version or volume name matches."""


class VolumeCorruptedError(VolumeError):
    """A finalized version's files no longer match its manifest."""


class SharedFileModifiedError(VolumeCorruptedError):
    """A fork's file was written in place while it still shared its parent's inode, so the parent changed too."""


class UnsupportedFileError(VolumeError):
    """Something in a mount that a version cannot hold (a FIFO, a socket, a device)."""


@dataclass(frozen=True)
class FileEntry:
    """One file of a finalized version, as its manifest records it."""

    sha256: str
    size: int
    executable: bool


@dataclass(frozen=True)
class _Inherited:
    """What a fork knew about a file it inherited, so finalize can reuse its digest, not re-read it."""

    ino: int
    size: int
    mtime_ns: int
    entry: FileEntry
    shares_parent_inode: bool


def probe_share_mode(directory: str | os.PathLike[str]) -> ShareMode:
    """The cheapest sharing `directory`'s filesystem supports: "reflink", else "hardlink", else "copy"."""
    probe = Path(directory) / f".probe-{uuid.uuid4().hex}"
    probe.mkdir(parents=True)
    try:
        src = probe / "src"
        src.write_bytes(b"probe")
        if _try_reflink(src, probe / "clone"):
            return "reflink"
        try:
            os.link(src, probe / "link")
        except OSError:
            return "copy"
        return "hardlink"
    finally:
        shutil.rmtree(probe, ignore_errors=True)


class LocalVolumeStore:
    """Versioned copy-on-write volumes under one directory.

    `share` is "auto" (probe the filesystem) or a `ShareMode` to force one; `durable=False` skips the fsyncs that make a
    published version survive power loss (for tests and benchmarks that do not need it).
    """

    def __init__(
        self, root: str | os.PathLike[str], *, share: ShareMode | Literal["auto"] = "auto", durable: bool = True
    ) -> None:
        self.root = Path(root).absolute()
        self.durable = durable
        for sub in ("versions", "staging", "locks"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
            if (self.root / sub).is_symlink():
                # Staging is deleted and versions are written through: a link would carry both outside the store.
                raise VolumeCorruptedError(
                    f"{self.root / sub} is a symlink, so the store would write and delete wherever it points; a "
                    f"store's directories are its own. Remove the link (or open a store you built) and retry"
                )
        if share == "auto":
            self._share_mode: ShareMode = probe_share_mode(self.root / "staging")
        elif share in SHARE_MODES:
            self._share_mode = share
        else:
            raise ValueError(f"share must be 'auto' or one of {SHARE_MODES}, not {share!r}")
        self._manifests: dict[str, dict[str, Any]] = {}

    def __repr__(self) -> str:
        return f"LocalVolumeStore({str(self.root)!r}, share={self._share_mode!r})"

    @property
    def share_mode(self) -> ShareMode:
        """How forks share their parent's files on this store's filesystem."""
        return self._share_mode

    def new(self, name: str) -> LocalWritableVolume:
        """An empty writable volume named `name` (the first version of a buffer or a world)."""
        return self._open_writer(name, parent=None)

    def open(self, name_or_version: str) -> LocalVolumeVersion:
        """A finalized version: by version id, by volume name (its latest version), or by a unique version-id prefix."""
        key = name_or_version
        if _VERSION_RE.fullmatch(key) and (self.root / "versions" / key / "manifest.json").is_file():
            return self._version(key)
        if _NAME_RE.fullmatch(key):
            named = self.versions(key)
            if named:
                return named[-1]
        if len(key) >= _MIN_PREFIX and re.fullmatch(r"[0-9a-f]+", key):
            matches = [v for v in self._version_ids() if v.startswith(key)]
            if len(matches) == 1:
                return self._version(matches[0])
            if len(matches) > 1:
                raise VersionNotFoundError(
                    f"version prefix {key!r} is ambiguous in {self.root}: it matches {len(matches)} versions; "
                    f"give more digits"
                )
        names = sorted({v.name for v in self.versions()})
        raise VersionNotFoundError(
            f"no version or volume named {key!r} in {self.root}; volume names here: {names or 'none'} "
            f"(a version is addressed by its 64-hex id or a unique prefix of at least {_MIN_PREFIX} digits)"
        )

    def versions(self, name: str | None = None) -> list[LocalVolumeVersion]:
        """Every finalized version (of volume `name` if given), oldest first by publication time."""
        found = [self._version(v) for v in self._version_ids()]
        if name is not None:
            found = [v for v in found if v.name == name]
        return sorted(found, key=lambda v: (v.published_at_ns, v.version))

    def discard_abandoned(self) -> list[str]:
        """Delete the staging directories of writers that died (no live lock) and return their names; live ones stay."""
        discarded = []
        for staging in sorted((self.root / "staging").iterdir()):
            if not staging.is_dir() or staging.name.startswith(".probe-"):
                continue
            try:
                fd = self._acquire(staging.name)
            except WriterConflictError:
                continue
            try:
                _force_rmtree(staging)
                discarded.append(staging.name)
            finally:
                self._release(staging.name, fd)
        return discarded

    def _version_ids(self) -> list[str]:
        return [e.name for e in os.scandir(self.root / "versions") if _VERSION_RE.fullmatch(e.name)]

    def _version(self, version: str) -> LocalVolumeVersion:
        cached = self._manifests.get(version)
        if cached is not None:
            return LocalVolumeVersion(self, cached)
        path = self.root / "versions" / version / "manifest.json"
        try:
            manifest: Any = json.loads(path.read_text(encoding="utf-8"))
            problem = manifest_problem(manifest, version)
        except FileNotFoundError:
            raise VersionNotFoundError(f"version {version} is not in {self.root}") from None
        except ValueError as exc:  # not JSON, or not UTF-8: a damaged or foreign file
            problem = f"the manifest is not JSON ({exc})"
        if problem:
            raise VolumeCorruptedError(
                f"version {version} in {self.root} is refused: {problem}. Its manifest ({path}) was not written "
                f"by this store or was changed since, and using it could read or write outside the volume: "
                f"restore it from its source (or delete {path.parent}) and retry"
            )
        self._manifests[version] = manifest
        return LocalVolumeVersion(self, manifest)

    def _open_writer(self, name: str, parent: LocalVolumeVersion | None) -> LocalWritableVolume:
        _check_name(name)
        fd = self._acquire(name)
        staging = self.root / "staging" / name
        try:
            # Whoever held this name before us died before publishing (we hold its lock): its half-written files go.
            _force_rmtree(staging)
            (staging / "data").mkdir(parents=True)
            forked_at_ns = time.time_ns()
            inherited = self._populate(parent, staging / "data") if parent is not None else {}
        except BaseException:
            _force_rmtree(staging)
            self._release(name, fd)
            raise
        return LocalWritableVolume(self, name, parent, staging, fd, inherited, forked_at_ns)

    def _populate(self, parent: LocalVolumeVersion, data: Path) -> dict[str, _Inherited]:
        src_root = parent.path()
        for d in ("", *parent.dirs):
            # A directory replaced by a symlink would make the links below read files from wherever it points.
            if not stat.S_ISDIR(os.lstat(src_root / d).st_mode):
                raise VolumeCorruptedError(
                    f"cannot fork version {parent.version} ({parent.name!r}): {src_root / d} is not a directory (a "
                    f"symlink?), so its files could come from outside the volume; fork an intact version"
                )
        for d in parent.dirs:
            (data / d).mkdir(parents=True, exist_ok=True)
        for rel, target in parent.symlinks.items():
            os.symlink(target, data / rel)
        inherited: dict[str, _Inherited] = {}
        for rel, entry in parent.files.items():
            src = src_root / rel
            st = os.lstat(src)
            problem = parent._stat_problem(rel, st)
            if problem:
                raise VolumeCorruptedError(
                    f"cannot fork version {parent.version} ({parent.name!r}): {problem}; it was modified after it "
                    f"was finalized (see rl.volumes.local on writers that bypass file modes); fork an intact version"
                )
            dst = data / rel
            shares = False
            if self._share_mode == "hardlink":
                try:
                    os.link(src, dst)
                    shares = True
                except OSError as exc:
                    # The link limit, protected_hardlinks (another user's file) or another mount: copy this one.
                    if exc.errno not in (errno.EMLINK, errno.EPERM, errno.EXDEV):
                        raise
            if not shares:
                if not (self._share_mode == "reflink" and _try_reflink(src, dst)):
                    shutil.copyfile(src, dst)
                os.chmod(dst, _read_only_mode(entry.executable))
                # Keeping the parent's mtime keeps the copy out of the racy window, so finalize can trust its stat.
                os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns))
            ino = st.st_ino if shares else os.lstat(dst).st_ino
            inherited[rel] = _Inherited(ino, st.st_size, st.st_mtime_ns, entry, shares)
        return inherited

    def _acquire(self, name: str) -> int:
        key = (os.getpid(), str(self.root), name)
        with _OPEN_WRITERS_LOCK:
            # The in-process set covers filesystems (NFS) whose flock emulation does not conflict within one process.
            if key in _OPEN_WRITERS:
                raise WriterConflictError(_conflict_message(name, os.getpid(), self.root))
            fd = os.open(self.root / "locks" / f"{name}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
                os.close(fd)
                raise WriterConflictError(_conflict_message(name, holder, self.root)) from None
            except BaseException:
                os.close(fd)
                raise
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            _OPEN_WRITERS.add(key)
        return fd

    def _release(self, name: str, fd: int) -> None:
        _release_writer(str(self.root), name, fd)


class LocalVolumeVersion:
    """A finalized, immutable version: files under `path()` plus a manifest. Implements `rl.protocols.VolumeVersion`."""

    def __init__(self, store: LocalVolumeStore, manifest: Mapping[str, Any]) -> None:
        self._store = store
        self._manifest = manifest
        self._files = {rel: FileEntry(**e) for rel, e in manifest["files"].items()}

    def __repr__(self) -> str:
        return (
            f"<LocalVolumeVersion {self.name!r} {self.version[:12]} files={len(self._files)} message={self.message!r}>"
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, LocalVolumeVersion):
            return NotImplemented
        return (self._store.root, self.version) == (other._store.root, other.version)

    def __hash__(self) -> int:
        return hash((self._store.root, self.version))

    @property
    def name(self) -> str:
        return str(self._manifest["name"])

    @property
    def version(self) -> str:
        """The 64-hex content-addressed id: sha256 of (name, parent, message, content digest)."""
        return str(self._manifest["version"])

    @property
    def parent(self) -> str | None:
        """The version this one was forked from; None for a volume made by `new`."""
        return self._manifest["parent"]

    @property
    def message(self) -> str:
        return str(self._manifest["message"])

    @property
    def content_digest(self) -> str:
        """sha256 of the file tree alone: equal for any two versions holding the same files."""
        return str(self._manifest["content_digest"])

    @property
    def published_at_ns(self) -> int:
        return int(self._manifest["published_at_ns"])

    @property
    def files(self) -> Mapping[str, FileEntry]:
        """Every regular file, by POSIX path relative to `path()`."""
        return self._files

    @property
    def dirs(self) -> tuple[str, ...]:
        return tuple(self._manifest["dirs"])

    @property
    def symlinks(self) -> Mapping[str, str]:
        return dict(self._manifest["symlinks"])

    @property
    def manifest(self) -> dict[str, Any]:
        return json.loads(json.dumps(self._manifest, allow_nan=False))

    @property
    def store(self) -> LocalVolumeStore:
        return self._store

    def path(self) -> Path:
        """The version's files: read-only, and never changed after finalize."""
        return self._store.root / "versions" / self.version / "data"

    def file(self, relpath: str) -> Path:
        """The path of one file of this version; FileNotFoundError if the version has no file by that name."""
        rel = _clean_relpath(relpath)
        if rel not in self._files:
            raise FileNotFoundError(f"{rel!r} is not a file of version {self.version} ({self.name!r})")
        path = self.path() / rel
        expected = os.path.join(os.path.realpath(self._store.root), "versions", self.version, "data", rel)
        if os.path.realpath(path) != expected:
            raise VolumeCorruptedError(
                f"{rel!r} of version {self.version} ({self.name!r}) resolves to {os.path.realpath(path)}, outside the "
                f"version's files (a symlink replaced a file or directory); delete {self.path().parent} or get the "
                f"directory again from its source"
            )
        return path

    def read_bytes(self, relpath: str) -> bytes:
        return self.file(relpath).read_bytes()

    def read_text(self, relpath: str, encoding: str = "utf-8") -> str:
        return self.file(relpath).read_text(encoding=encoding)

    def fork(self, name: str) -> LocalWritableVolume:
        """A writable volume `name` sharing this version's files without copying them; this version never changes."""
        return self._store._open_writer(name, parent=self)

    def as_ref(self) -> ArtifactRef:
        """This version as an `ArtifactRef` (its directory's file URI and its version id)."""
        return ArtifactRef(uri=self.path().as_uri(), digest=self.version)

    def verify(self, *, deep: bool = False) -> None:
        """Raise VolumeCorruptedError if the files no longer match the manifest (`deep`: re-hash them)."""
        problems: list[str] = []
        root = self.path()
        present = set()
        for rel, kind, st in _walk(root):
            present.add(rel)
            if kind == "file":
                entry = self._files.get(rel)
                if entry is None:
                    problems.append(f"{rel} is not in the manifest")
                    continue
                problem = self._stat_problem(rel, st)
                if problem:
                    problems.append(problem)
                elif deep and _hash_file(root / rel, fsync=False) != entry.sha256:
                    problems.append(f"{rel}'s bytes no longer hash to {entry.sha256[:12]}")
            elif kind == "dir" and rel not in self._manifest["dirs"]:
                problems.append(f"directory {rel} is not in the manifest")
            elif kind == "symlink" and self._manifest["symlinks"].get(rel) != os.readlink(root / rel):
                problems.append(f"symlink {rel} is not in the manifest or points elsewhere")
        expected = set(self._files) | set(self._manifest["dirs"]) | set(self._manifest["symlinks"])
        problems.extend(f"{rel} is missing" for rel in sorted(expected - present))
        if problems:
            raise VolumeCorruptedError(
                f"version {self.version} ({self.name!r}) at {root} was modified after it was finalized: "
                + "; ".join(problems)
            )

    def _stat_problem(self, rel: str, st: os.stat_result) -> str | None:
        entry = self._files[rel]
        if not stat.S_ISREG(st.st_mode):
            return f"{rel} is no longer a regular file"
        if st.st_size != entry.size:
            return f"{rel} is {st.st_size} bytes, its manifest says {entry.size}"
        if st.st_mtime_ns != self._manifest["mtimes_ns"][rel]:
            return f"{rel} was written after it was sealed (its mtime changed)"
        if st.st_mode & _WRITE_BITS:
            return f"{rel} was made writable (mode {stat.S_IMODE(st.st_mode):o})"
        return None


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
        inherited: dict[str, _Inherited],
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
        self._finalizer = weakref.finalize(self, _release_writer, str(store.root), name, lock_fd)

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
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            mode = 0o755 if os.lstat(path).st_mode & 0o111 else 0o644
        except FileNotFoundError:
            mode = 0o644
        tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:8]}")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
            with open(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
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
        path.parent.mkdir(parents=True, exist_ok=True)
        if os.path.lexists(path):
            if "w" in mode:
                # Truncation would write the shared inode; a fresh file under the same name shares nothing.
                os.unlink(path)
            elif "a" in mode or "+" in mode:
                self.unshare(relpath)
        if "b" in mode:
            return open(path, mode)
        return open(path, mode, encoding=encoding or "utf-8", newline=newline)

    def unshare(self, relpath: str) -> Path:
        """Make `relpath` a private writable file (a reflink where it can, else a copy); returns its path."""
        self._check_open()
        path = self._path(relpath)
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode):
            raise InvalidPathError(
                f"{relpath!r} in volume {self._name!r} is not a regular file, so it cannot be unshared"
            )
        writable = stat.S_IMODE(st.st_mode) | 0o200
        if st.st_nlink > 1:
            tmp = path.with_name(f".{path.name}.unshare-{uuid.uuid4().hex[:8]}")
            try:
                if not (self._store.share_mode == "reflink" and _try_reflink(path, tmp)):
                    shutil.copyfile(path, tmp)
                os.chmod(tmp, writable)
                os.replace(tmp, path)
            except BaseException:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
                raise
        elif st.st_mode & 0o200 == 0:
            os.chmod(path, writable)
        return path

    def delete(self, relpath: str) -> None:
        """Remove a file, symlink or directory tree from this fork (the parent keeps its copy)."""
        self._check_open()
        path = self._path(relpath)
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            os.unlink(path)

    def finalize(self, message: str) -> LocalVolumeVersion:
        """Seal the mount into an immutable version and publish it atomically; this writer is closed afterwards."""
        self._check_open()
        data = self._staging / "data"
        files, dirs, symlinks, mtimes = self._scan(data)
        tree = {"files": files, "dirs": dirs, "symlinks": symlinks}
        identity = {
            "format": MANIFEST_FORMAT,
            "name": self._name,
            "parent": self._parent.version if self._parent else None,
            "message": message,
            "content_digest": _digest(tree),
        }
        version = _digest(identity)
        manifest = {**identity, "version": version, **tree, "published_at_ns": time.time_ns(), "mtimes_ns": mtimes}
        durable = self._store.durable
        _seal_modes(data, durable=durable)
        _write_json(self._staging / "manifest.json", manifest, durable=durable)
        if durable:
            _fsync_dir(self._staging)
        target = self._store.root / "versions" / version
        try:
            os.rename(self._staging, target)
        except OSError as exc:
            if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY) or not (target / "manifest.json").is_file():
                raise
            # The same name, parent, message and files were published before (a retried task): that version is this one.
            _force_rmtree(self._staging)
        if durable:
            _fsync_dir(target.parent)
            _fsync_dir(self._staging.parent)
        with contextlib.suppress(OSError):
            os.chmod(target, 0o555)
        self._close(f"finalized as {version}")
        return self._store._version(version)

    def abandon(self) -> None:
        """Discard everything written and release the name; nothing becomes visible."""
        self._check_open()
        _force_rmtree(self._staging)
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
        rel = _clean_relpath(relpath)
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

    def _scan(self, data: Path) -> tuple[dict[str, dict[str, Any]], list[str], dict[str, str], dict[str, int]]:
        files: dict[str, dict[str, Any]] = {}
        dirs: list[str] = []
        symlinks: dict[str, str] = {}
        mtimes: dict[str, int] = {}
        for rel, kind, st in _walk(data):
            if kind == "dir":
                dirs.append(rel)
            elif kind == "symlink":
                symlinks[rel] = os.readlink(data / rel)
                problem = symlink_target_problem(rel, symlinks[rel])
                if problem:
                    raise InvalidPathError(
                        f"{problem} (volume {self._name!r}); a version's symlinks stay inside it, so a fork never "
                        f"reaches outside. Point it at a path inside the volume, or copy the target in, then finalize"
                    )
            elif kind == "file":
                files[rel] = self._file_entry(data / rel, rel, st)
                mtimes[rel] = st.st_mtime_ns
            else:
                raise UnsupportedFileError(
                    f"{rel} in volume {self._name!r} is a {kind}; a version holds only files, directories and "
                    f"symlinks. Delete it before finalizing"
                )
        return files, sorted(dirs), symlinks, mtimes

    def _file_entry(self, path: Path, rel: str, st: os.stat_result) -> dict[str, Any]:
        executable = bool(st.st_mode & 0o111)
        inh = self._inherited.get(rel)
        if (
            inh is not None
            and (st.st_ino, st.st_size, st.st_mtime_ns) == (inh.ino, inh.size, inh.mtime_ns)
            and not st.st_mode & _WRITE_BITS
            and inh.mtime_ns < self._forked_at_ns - _RACY_NS
        ):
            return {"sha256": inh.entry.sha256, "size": inh.size, "executable": inh.entry.executable}
        # Still the parent's inode: its bytes were made durable when the parent was published, and if they changed
        # in place the check below refuses the fork; so only a file this writer created or unshared is fsynced. (A
        # parent published within the racy window is rehashed on every fork: a fast loop's buffer did that for its last
        # ~2 s of iterations each time, and the redundant fsyncs were most of an iteration.)
        inherited_inode = inh is not None and inh.shares_parent_inode and st.st_ino == inh.ino
        digest = _hash_file(path, fsync=self._store.durable and not inherited_inode)
        if inh is not None and inh.shares_parent_inode and st.st_ino == inh.ino and digest != inh.entry.sha256:
            parent = self._parent.version if self._parent else "?"
            raise SharedFileModifiedError(
                f"{rel} in volume {self._name!r} was written in place while still a hard link to version {parent}, "
                f"so that version changed too and is now corrupt (a writer that bypasses file modes, such as root, "
                f"did it). Write inherited files through write_bytes/open_for_write/unshare, which break the link "
                f"first; abandon this fork and rebuild the damaged version"
            )
        return {"sha256": digest, "size": st.st_size, "executable": executable}


def _release_writer(root: str, name: str, fd: int) -> None:
    with _OPEN_WRITERS_LOCK:
        _OPEN_WRITERS.discard((os.getpid(), root, name))
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_UN)
        with contextlib.suppress(OSError):
            os.close(fd)


def _conflict_message(name: str, holder: object, root: Path) -> str:
    return (
        f"volume {name!r} in {root} already has a writer (pid {holder}); each fork has exactly one writer. "
        f"Finalize or abandon that writer first, or fork under a different name"
    )


def _check_name(name: str) -> None:
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name) or _VERSION_RE.fullmatch(name):
        raise InvalidNameError(
            f"volume name {name!r} is invalid: use 1-200 characters from letters, digits, '.', '_' and '-', "
            f"starting with a letter or digit, and not a 64-hex string (those address versions)"
        )


def _clean_relpath(relpath: str | os.PathLike[str]) -> str:
    rel = PurePosixPath(os.fspath(relpath))
    if rel.is_absolute() or not rel.parts or ".." in rel.parts or rel == PurePosixPath("."):
        raise InvalidPathError(f"{os.fspath(relpath)!r} must be a relative path inside the volume, without '..'")
    return rel.as_posix()


def _walk(root: Path, prefix: str = "") -> Iterator[tuple[str, str, os.stat_result]]:
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
            yield from _walk(Path(entry.path), f"{rel}/")
        elif stat.S_ISREG(st.st_mode):
            yield rel, "file", st
        else:
            yield rel, _special_kind(st.st_mode), st


def _special_kind(mode: int) -> str:
    for test, kind in ((stat.S_ISFIFO, "FIFO"), (stat.S_ISSOCK, "socket"), (stat.S_ISCHR, "character device")):
        if test(mode):
            return kind
    return "block device" if stat.S_ISBLK(mode) else "special file"


def _read_only_mode(executable: bool) -> int:
    return 0o555 if executable else 0o444


def _seal_modes(data: Path, *, durable: bool) -> None:
    dirs = [data]
    for rel, kind, st in _walk(data):
        path = data / rel
        if kind == "file":
            ro = _read_only_mode(bool(st.st_mode & 0o111))
            # A shared inode is already read-only; leaving it alone keeps its ctime (and the parent's) untouched.
            if stat.S_IMODE(st.st_mode) != ro:
                os.chmod(path, ro)
        elif kind == "dir":
            dirs.append(path)
    for d in reversed(dirs):
        if durable:
            _fsync_dir(d)
        os.chmod(d, 0o555)


def _try_reflink(src: Path, dst: Path) -> bool:
    """Clone src's extents into a new file dst (FICLONE); False, leaving no dst, where the filesystem cannot."""
    if sys.platform != "linux":
        return False
    try:
        with open(src, "rb") as fsrc, open(dst, "xb") as fdst:
            fcntl.ioctl(fdst.fileno(), _FICLONE, fsrc.fileno())
    except OSError:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(dst)
        return False
    return True


def _hash_file(path: Path, *, fsync: bool) -> str:
    with open(path, "rb") as f:
        digest = hashlib.file_digest(f, "sha256").hexdigest()
        if fsync:
            os.fsync(f.fileno())
    return digest


def _write_json(path: Path, obj: Any, *, durable: bool) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, sort_keys=True, indent=1, allow_nan=False)
        if durable:
            f.flush()
            os.fsync(f.fileno())
    os.chmod(tmp, 0o444)
    os.replace(tmp, path)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _force_rmtree(path: Path) -> None:
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
