"""`LocalVolumeStore`: versioned copy-on-write volumes under one directory (layout, sharing and crash safety:
docs/volumes.md). It opens versions and forks them into writable volumes."""

from __future__ import annotations

import errno
import json
import os
import re
import time
import uuid
from pathlib import Path
from typing import Any, Literal

from rl import platform
from rl.errors import InvalidNameError, VersionNotFoundError, VolumeCorruptedError, WriterConflictError, shown
from rl.storage.safe_fs import Tree, create_at
from rl.storage.volumes.filesystem import RACY_NS, SHARE_MODES, ShareMode, racy_window_ns, read_only_mode
from rl.storage.volumes.manifest import NAME_RE, VERSION_RE, manifest_problem
from rl.storage.volumes.version import LocalVolumeVersion
from rl.storage.volumes.writable import Inherited, LocalWritableVolume
from rl.storage.volumes.writer_lock import acquire_writer, release_writer

MIN_PREFIX = 8
# The racy window's probe writes a fresh file every PROBE_S / PROBE_FILES seconds for PROBE_S before reading their
# mtimes back: several steps of a jiffy-stamped filesystem (4 ms at 250 Hz), and nothing of a 1 s or 2 s one, which then
# gets the ceiling. A round that saw under two steps is tried again, up to PROBE_ROUNDS.
PROBE_S = 0.025
PROBE_FILES = 64
PROBE_ROUNDS = 4
# The racy windows probed in this process, by filesystem (device): a test suite opens thousands of stores on one.
_PROBED_RACY_NS: dict[int, int] = {}
# A manifest lists a version's files: far above any buffer's or world's, far below what would exhaust memory.
MAX_MANIFEST_BYTES = 64 << 20


class LocalVolumeStore:
    """Versioned copy-on-write volumes under one directory.

    `share` is "auto" (probe the filesystem) or a `ShareMode` to force one; `durable=False` skips the fsyncs that make a
    published version survive power loss (for tests and benchmarks that do not need it); `cloner` clones a file where
    forks reflink (`rl.platform.clone_at`; default this platform's); `racy_ns` is the racy window (`racy_ns`) where it
    is known, None to probe it.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        share: ShareMode | Literal["auto"] = "auto",
        durable: bool = True,
        cloner: platform.Cloner = platform.CLONER,
        racy_ns: int | None = None,
    ) -> None:
        self.root = Path(os.path.abspath(root))
        self.durable = durable
        # Everything from the store's own directory down is reached without following a link (rl.storage.safe_fs): a
        # folder swapped for a symlink after these checks cannot carry a write or a delete outside the store.
        self.fs = Tree(self.root.parent, cloner)
        self.root.parent.mkdir(parents=True, exist_ok=True)
        for sub in ("versions", "staging", "locks"):
            if self.fs.kind(self.root / sub) is None:
                self.fs.mkdir(self.root / sub, parents=True, exist_ok=True)
            if self.fs.kind(self.root / sub) == "symlink":
                # Staging is deleted and versions are written through: a link would carry both outside the store.
                raise VolumeCorruptedError(
                    f"{self.root / sub} is a symlink, so the store would write and delete wherever it points; a "
                    f"store's directories are its own. Remove the link (or open a store you built) and retry"
                )
        if share == "auto":
            self._share_mode: ShareMode = self._probe_share_mode()
        elif share in SHARE_MODES:
            self._share_mode = share
        else:
            raise ValueError(f"share must be 'auto' or one of {SHARE_MODES}, not {share!r}")
        self._manifests: dict[str, dict[str, Any]] = {}
        self._racy_ns = racy_ns  # None: probed when a finalize first asks (a store only read never does)

    def _probe_racy_ns(self) -> int:
        """`racy_window_ns` of the store's filesystem, from fresh files written in a row. Nothing is stat-ed until all
        are written: a kernel with multigrain timestamps stamps a file finely once its times were read."""
        window = RACY_NS
        for _ in range(PROBE_ROUNDS):
            probe = self.root / "staging" / f".probe-{uuid.uuid4().hex}"
            self.fs.mkdir(probe)
            try:
                clock: list[int] = []
                with self.fs.directory(probe) as dfd:
                    deadline = time.perf_counter() + PROBE_S
                    while len(clock) < PROBE_FILES and time.perf_counter() < deadline:
                        clock.append(time.time_ns())
                        os.close(create_at(dfd, str(len(clock))))
                        time.sleep(PROBE_S / PROBE_FILES)
                    stamps = [
                        os.stat(str(i), dir_fd=dfd, follow_symlinks=False).st_mtime_ns for i in range(1, len(clock) + 1)
                    ]
                window = racy_window_ns(list(zip(clock, stamps, strict=True)))
            finally:
                self.fs.rmtree(probe)
            if window < RACY_NS:
                break
        return window

    def _probe_share_mode(self) -> ShareMode:
        """The cheapest sharing the store's filesystem supports: "reflink", else "hardlink", else "copy"."""
        probe = self.root / "staging" / f".probe-{uuid.uuid4().hex}"
        self.fs.mkdir(probe)
        try:
            self.fs.write_atomic(probe / "src", b"probe", tmp_name=".src.tmp")
            if self.fs.copy_file(probe / "src", probe / "clone", reflink=True):
                return "reflink"
            try:
                self.fs.link(probe / "src", probe / "link")
            except OSError:
                return "copy"
            return "hardlink"
        finally:
            self.fs.rmtree(probe)

    def __repr__(self) -> str:
        return f"LocalVolumeStore({str(self.root)!r}, share={self._share_mode!r})"

    @property
    def share_mode(self) -> ShareMode:
        """How forks share their parent's files on this store's filesystem."""
        return self._share_mode

    @property
    def racy_ns(self) -> int:
        """An inherited file whose mtime is this close to a fork is re-hashed at finalize (`racy_window_ns`, probed
        once per filesystem)."""
        if self._racy_ns is None:
            device = os.stat(self.root).st_dev
            if device not in _PROBED_RACY_NS:
                _PROBED_RACY_NS[device] = self._probe_racy_ns()
            self._racy_ns = _PROBED_RACY_NS[device]
        return self._racy_ns

    def new(self, name: str) -> LocalWritableVolume:
        """An empty writable volume named `name` (the first version of a buffer or a world)."""
        return self.open_writer(name, parent=None)

    def open(self, name_or_version: str) -> LocalVolumeVersion:
        """A finalized version: by version id, by volume name (its latest version), or by a unique version-id prefix."""
        key = name_or_version
        if VERSION_RE.fullmatch(key) and self.fs.kind(self.root / "versions" / key / "manifest.json") == "file":
            return self.version(key)
        if NAME_RE.fullmatch(key):
            named = self.versions(key)
            if named:
                return named[-1]
        if len(key) >= MIN_PREFIX and re.fullmatch(r"[0-9a-f]+", key):
            matches = [v for v in self._version_ids() if v.startswith(key)]
            if len(matches) == 1:
                return self.version(matches[0])
            if len(matches) > 1:
                raise VersionNotFoundError(
                    f"version prefix {key!r} is ambiguous in {self.root}: it matches {len(matches)} versions; "
                    f"give more digits"
                )
        names = sorted({v.name for v in self.versions()})
        raise VersionNotFoundError(
            f"no version or volume named {key!r} in {self.root}; volume names here: {names or 'none'} "
            f"(a version is addressed by its 64-hex id or a unique prefix of at least {MIN_PREFIX} digits)"
        )

    def versions(self, name: str | None = None) -> list[LocalVolumeVersion]:
        """Every finalized version (of volume `name` if given), oldest first by publication time."""
        found = [self.version(v) for v in self._version_ids()]
        if name is not None:
            found = [v for v in found if v.name == name]
        return sorted(found, key=lambda v: (v.published_at_ns, v.version))

    def discard_abandoned(self) -> list[str]:
        """Delete the staging directories of writers that died (no live lock) and return their names; live ones stay."""
        discarded = []
        for entry in self.fs.listdir(self.root / "staging"):
            staging = self.root / "staging" / entry
            if self.fs.kind(staging) != "dir" or entry.startswith(".probe-") or not NAME_RE.fullmatch(entry):
                continue
            try:
                fd = acquire_writer(self.root, staging.name)
            except WriterConflictError:
                continue
            try:
                self.fs.rmtree(staging)
                discarded.append(staging.name)
            finally:
                release_writer(str(self.root), staging.name, fd)
        return discarded

    def _version_ids(self) -> list[str]:
        return [name for name in self.fs.listdir(self.root / "versions") if VERSION_RE.fullmatch(name)]

    def version(self, version: str) -> LocalVolumeVersion:
        """The finalized version with id `version` (64 hex digits), its manifest checked before it is trusted."""
        cached = self._manifests.get(version)
        if cached is not None:
            return LocalVolumeVersion(self, cached)
        path = self.root / "versions" / version / "manifest.json"
        try:
            manifest: Any = json.loads(self.fs.read_bytes(path, limit=MAX_MANIFEST_BYTES).decode("utf-8"))
            problem = manifest_problem(manifest, version)
        except FileNotFoundError:
            raise VersionNotFoundError(f"version {version} is not in {self.root}") from None
        except OverflowError:
            problem = f"the manifest is larger than {MAX_MANIFEST_BYTES} bytes"
        except RecursionError:
            problem = "the manifest nests deeper than a manifest does"
        except ValueError as exc:  # not JSON, or not UTF-8: a damaged or foreign file
            problem = f"the manifest is not JSON ({exc})"
        if problem:
            raise VolumeCorruptedError(
                f"version {version} in {self.root} is refused: {shown(problem)}. Its manifest ({path}) was not written "
                f"by this store or was changed since, and using it could read or write outside the volume: "
                f"restore it from its source (or delete {path.parent}) and retry"
            )
        self._manifests[version] = manifest
        return LocalVolumeVersion(self, manifest)

    def adopt(self, manifest: bytes) -> LocalVolumeVersion:
        """The version whose manifest this process has just written and published (`LocalWritableVolume.finalize`): it
        was built from the writer's own scan, so it is not read back and checked as a manifest from disk is."""
        parsed = json.loads(manifest)
        self._manifests[parsed["version"]] = parsed
        return LocalVolumeVersion(self, parsed)

    def open_writer(self, name: str, parent: LocalVolumeVersion | None) -> LocalWritableVolume:
        """A writable volume `name` holding `parent`'s files (shared, not copied, where the filesystem allows), or
        empty when `parent` is None: `new` and `LocalVolumeVersion.fork` call it."""
        check_name(name)
        fd = acquire_writer(self.root, name)
        staging = self.root / "staging" / name
        try:
            # Whoever held this name before us died before publishing (we hold its lock): its half-written files go.
            self.fs.rmtree(staging)
            # Not `parents`: a store folder gone mid-run (moved aside) is an error, not something to make anew.
            self.fs.mkdir(staging)
            self.fs.mkdir(staging / "data")
            forked_at_ns = time.time_ns()
            inherited = self._populate(parent, staging / "data") if parent is not None else {}
        except BaseException:
            self.fs.rmtree(staging)
            release_writer(str(self.root), name, fd)
            raise
        return LocalWritableVolume(self, name, parent, staging, fd, inherited, forked_at_ns)

    def _populate(self, parent: LocalVolumeVersion, data: Path) -> dict[str, Inherited]:
        src_root = parent.path()
        for d in ("", *parent.dirs):
            # A directory replaced by a symlink would make the links below read files from wherever it points.
            if self.fs.kind(src_root / d) != "dir":
                raise VolumeCorruptedError(
                    f"cannot fork version {parent.version} ({parent.name!r}): {src_root / d} is not a directory (a "
                    f"symlink?), so its files could come from outside the volume; fork an intact version"
                )
        for d in parent.dirs:
            self.fs.mkdir(data / d, parents=True, exist_ok=True)
        for rel, target in parent.symlinks.items():
            self.fs.symlink(target, data / rel)
        # Each directory's files through one held descriptor of it and of its copy: a fork of a version with N files
        # costs N stat and N link calls, not a walk from the store's top for each (a buffer's versions grow by a file
        # an iteration, so this was most of an append).
        by_dir: dict[str, list[tuple[str, str]]] = {}
        for rel in parent.files:
            d, _, name = rel.rpartition("/")
            by_dir.setdefault(d, []).append((rel, name))
        shared: dict[str, Inherited] = {}
        for d, items in by_dir.items():
            with self.fs.directory(src_root / d) as sfd, self.fs.directory(data / d) as dfd:
                for rel, name in items:
                    shared[rel] = self._inherit(parent, rel, (sfd, dfd, name), src_root, data)
        inherited = {rel: shared[rel] for rel in parent.files}
        return inherited

    def _inherit(
        self, parent: LocalVolumeVersion, rel: str, at: tuple[int, int, str], src_root: Path, data: Path
    ) -> Inherited:
        """File `rel` of `parent` into the fork: linked where the store shares files, else copied (`at`: the held
        source and destination directories and the file's name in them)."""
        sfd, dfd, name = at
        entry = parent.files[rel]
        st = os.stat(name, dir_fd=sfd, follow_symlinks=False)
        problem = parent.stat_problem(rel, st)
        if problem:
            raise VolumeCorruptedError(
                f"cannot fork version {parent.version} ({parent.name!r}): {problem}; it was modified after it "
                f"was finalized (see docs/volumes.md on writers that bypass file modes); fork an intact version"
            )
        shares = False
        if self._share_mode == "hardlink":
            try:
                os.link(name, name, src_dir_fd=sfd, dst_dir_fd=dfd, follow_symlinks=False)
                shares = True
            except OSError as exc:
                # The link limit, protected_hardlinks (another user's file) or another mount: copy this one.
                if exc.errno not in (errno.EMLINK, errno.EPERM, errno.EXDEV):
                    raise
        if not shares:
            src, dst = src_root / rel, data / rel
            self.fs.copy_file(src, dst, reflink=self._share_mode == "reflink")
            self.fs.chmod(dst, read_only_mode(entry.executable))
            # Keeping the parent's mtime keeps the copy out of the racy window, so finalize can trust its stat.
            self.fs.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns))
        ino = st.st_ino if shares else os.stat(name, dir_fd=dfd, follow_symlinks=False).st_ino
        return Inherited(ino, st.st_size, st.st_mtime_ns, entry, shares)


def check_name(name: str) -> None:
    if not isinstance(name, str) or not NAME_RE.fullmatch(name) or VERSION_RE.fullmatch(name):
        raise InvalidNameError(
            f"volume name {name!r} is invalid: use 1-200 characters from letters, digits, '.', '_' and '-', "
            f"starting with a letter or digit, and not a 64-hex string (those address versions)"
        )
