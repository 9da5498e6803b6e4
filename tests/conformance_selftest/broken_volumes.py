"""Volume stores a fork might write, one correct and several broken, each a bug a real store ships; the volume laws must
fail each broken one on the law it breaks and pass the correct one (so the laws are not about our `LocalVolumeStore`).

`DirStore` is the simplest correct store: a fork is a full copy of its parent's directory, a version is a directory
named by the hash of its name, parent, message and files, and a name has one writer (a weak reference, so a writer the
process drops is dead). Each broken store changes one method.
"""

from __future__ import annotations

import atexit
import hashlib
import itertools
import json
import re
import shutil
import tempfile
import uuid
import weakref
from pathlib import Path

from rl.conformance import Implementation

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")
_ROOT = Path(tempfile.mkdtemp(prefix="rl-selftest-volumes-"))
atexit.register(shutil.rmtree, _ROOT, ignore_errors=True)
_COUNT = itertools.count()


def _files(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


class DirVersion:
    def __init__(self, store: DirStore, version: str) -> None:
        self.store = store
        self.version = version
        self.meta = json.loads((store.root / "versions" / version / "meta.json").read_text())

    @property
    def name(self) -> str:
        return self.meta["name"]

    def path(self) -> Path:
        return self.store.data_of(self)

    def fork(self, name: str) -> DirWriter:
        return self.store.writer(name, self)


class DirWriter:
    def __init__(self, store: DirStore, name: str, parent: DirVersion | None, mount: Path) -> None:
        self.store = store
        self._name = name
        self.parent = parent
        self._mount = mount
        self.closed = False

    @property
    def name(self) -> str:
        return self._name

    def mount(self) -> Path:
        if self.closed:
            raise RuntimeError(f"writer {self._name!r} is finalized")
        return self._mount

    def finalize(self, message: str) -> DirVersion:
        mount = self.mount()
        self.store.check_tree(mount)
        identity = {"name": self._name, "parent": self.parent and self.parent.version, "message": message}
        version = self.store.version_id({**identity, "files": _files(mount)})
        target = self.store.root / "versions" / version
        if not target.exists():
            self.store.publish(self, target, {**identity, "seq": next(_COUNT)})
        self.store.discard(self)
        self.closed = True
        return DirVersion(self.store, version)


class DirStore:
    """A correct store: full copies, content-addressed versions, one writer per name."""

    def __init__(self) -> None:
        self.root = _ROOT / f"store-{next(_COUNT)}"
        (self.root / "versions").mkdir(parents=True)
        (self.root / "staging").mkdir()
        self.writers: dict[str, weakref.ref[DirWriter]] = {}

    def new(self, name: str) -> DirWriter:
        return self.writer(name, None)

    def open(self, key: str) -> DirVersion:
        if (self.root / "versions" / key / "meta.json").is_file():
            return DirVersion(self, key)
        named = self.versions(key)
        if named:
            return named[-1]
        raise LookupError(f"no version or volume named {key!r}")

    def versions(self, name: str | None = None) -> list[DirVersion]:
        found = [DirVersion(self, p.name) for p in (self.root / "versions").iterdir()]
        return sorted((v for v in found if name in (None, v.name)), key=lambda v: v.meta["seq"])

    def writer(self, name: str, parent: DirVersion | None) -> DirWriter:
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise ValueError(f"bad volume name {name!r}")
        self.check_no_writer(name)
        writer = DirWriter(self, name, parent, self.populate(name, parent))
        self.writers[name] = weakref.ref(writer)
        return writer

    def check_tree(self, mount: Path) -> None:
        """This store holds files and directories only (a copy would follow a link, and one to an ancestor loops)."""
        links = [p.relative_to(mount).as_posix() for p in sorted(mount.rglob("*")) if p.is_symlink()]
        if links:
            raise ValueError(f"this store holds no symlinks; copy the targets in instead of {links}")

    def check_no_writer(self, name: str) -> None:
        live = self.writers.get(name)
        if live is not None and live() is not None and not live().closed:  # type: ignore[union-attr]
            raise RuntimeError(f"volume {name!r} already has a writer")

    def populate(self, name: str, parent: DirVersion | None) -> Path:
        staging = self.root / "staging" / name
        shutil.rmtree(staging, ignore_errors=True)  # a dead writer's files
        if parent is None:
            staging.mkdir()
        else:
            shutil.copytree(parent.path(), staging)
        return staging

    def data_of(self, version: DirVersion) -> Path:
        return self.root / "versions" / version.version / "data"

    def version_id(self, identity: dict[str, object]) -> str:
        return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()

    def publish(self, writer: DirWriter, target: Path, meta: dict[str, object]) -> None:
        target.mkdir()
        shutil.copytree(writer.mount(), target / "data")
        (target / "meta.json").write_text(json.dumps(meta))

    def discard(self, writer: DirWriter) -> None:
        shutil.rmtree(writer.mount(), ignore_errors=True)


class LeakyForkStore(DirStore):
    """A fork mounts its parent's own directory instead of a copy (what Flyte's local mode does with a `Dir`): every
    write of the fork lands in the published version."""

    def populate(self, name: str, parent: DirVersion | None) -> Path:
        return parent.path() if parent is not None else super().populate(name, parent)

    def discard(self, writer: DirWriter) -> None:
        if writer.parent is None:
            super().discard(writer)


class OneDirectoryPerNameStore(DirStore):
    """Keeps one data directory per volume name (a "latest" folder), so finalizing a fork under its parent's name
    overwrites the parent's files: the ids stay, what they point at changes."""

    def data_of(self, version: DirVersion) -> Path:
        return self.root / "by-name" / version.name

    def publish(self, writer: DirWriter, target: Path, meta: dict[str, object]) -> None:
        target.mkdir()
        data = self.root / "by-name" / writer.name
        shutil.rmtree(data, ignore_errors=True)
        shutil.copytree(writer.mount(), data)
        (target / "meta.json").write_text(json.dumps(meta))


class NoWriterLockStore(DirStore):
    """Never checks for an open writer: two writers of one name race to publish it."""

    def check_no_writer(self, name: str) -> None:
        pass


class StaleStagingStore(DirStore):
    """Reuses a name's staging directory as it finds it: a retried task starts with the dead attempt's files."""

    def populate(self, name: str, parent: DirVersion | None) -> Path:
        staging = self.root / "staging" / name
        if parent is None:
            staging.mkdir(exist_ok=True)
        else:
            shutil.copytree(parent.path(), staging, dirs_exist_ok=True)
        return staging


class RandomIdStore(DirStore):
    """Names each version with a fresh uuid: a task retried after it finalized publishes a duplicate version."""

    def version_id(self, identity: dict[str, object]) -> str:
        return uuid.uuid4().hex


class SymlinkKeepingStore(DirStore):
    """Copies symlinks as symlinks (to publish a tree as written) without checking where they lead: a link in a deep
    directory that climbs one level too many points outside the published version, and outside every fork of it."""

    def check_tree(self, mount: Path) -> None:
        pass

    def populate(self, name: str, parent: DirVersion | None) -> Path:
        staging = self.root / "staging" / name
        shutil.rmtree(staging, ignore_errors=True)
        if parent is None:
            staging.mkdir()
        else:
            shutil.copytree(parent.path(), staging, symlinks=True)
        return staging

    def publish(self, writer: DirWriter, target: Path, meta: dict[str, object]) -> None:
        target.mkdir()
        shutil.copytree(writer.mount(), target / "data", symlinks=True)
        (target / "meta.json").write_text(json.dumps(meta))


DIR_STORE = Implementation(name="dir-store", volume_store=DirStore)
LEAKY_FORK = Implementation(name="leaky-fork", volume_store=LeakyForkStore)
ONE_DIRECTORY_PER_NAME = Implementation(name="one-directory-per-name", volume_store=OneDirectoryPerNameStore)
NO_WRITER_LOCK = Implementation(name="no-writer-lock", volume_store=NoWriterLockStore)
STALE_STAGING = Implementation(name="stale-staging", volume_store=StaleStagingStore)
RANDOM_ID = Implementation(name="random-id", volume_store=RandomIdStore)
SYMLINK_KEEPING = Implementation(name="symlink-keeping", volume_store=SymlinkKeepingStore)
