"""`LocalVolumeVersion`: a finalized, immutable version of a volume, its files read-only and checked against its
manifest."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rl.errors import VolumeCorruptedError
from rl.storage.volumes.filesystem import WRITE_BITS, clean_relpath
from rl.storage.volumes.manifest import FileEntry
from rl.types import ArtifactRef

if TYPE_CHECKING:
    from rl.storage.volumes.store import LocalVolumeStore
    from rl.storage.volumes.writable import LocalWritableVolume


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
        rel = clean_relpath(relpath)
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
        """One file's bytes, read without following a link (a folder swapped for one after `file`'s check included)."""
        return self._store.fs.read_bytes(self.file(relpath))

    def read_text(self, relpath: str, encoding: str = "utf-8") -> str:
        return self.read_bytes(relpath).decode(encoding)

    def fork(self, name: str) -> LocalWritableVolume:
        """A writable volume `name` sharing this version's files without copying them; this version never changes."""
        return self._store.open_writer(name, parent=self)

    def as_ref(self) -> ArtifactRef:
        """This version as an `ArtifactRef` (its directory's file URI and its version id)."""
        return ArtifactRef(uri=self.path().as_uri(), digest=self.version)

    def verify(self, *, deep: bool = False) -> None:
        """Raise VolumeCorruptedError if the files no longer match the manifest (`deep`: re-hash them)."""
        problems: list[str] = []
        root = self.path()
        present = set()
        fs = self._store.fs
        for rel, kind, st in fs.walk(root):
            present.add(rel)
            if kind == "file":
                entry = self._files.get(rel)
                if entry is None:
                    problems.append(f"{rel} is not in the manifest")
                    continue
                problem = self.stat_problem(rel, st)
                if problem:
                    problems.append(problem)
                elif deep and fs.hash_file(root / rel) != entry.sha256:
                    problems.append(f"{rel}'s bytes no longer hash to {entry.sha256[:12]}")
            elif kind == "dir" and rel not in self._manifest["dirs"]:
                problems.append(f"directory {rel} is not in the manifest")
            elif kind == "symlink" and self._manifest["symlinks"].get(rel) != fs.readlink(root / rel):
                problems.append(f"symlink {rel} is not in the manifest or points elsewhere")
        expected = set(self._files) | set(self._manifest["dirs"]) | set(self._manifest["symlinks"])
        problems.extend(f"{rel} is missing" for rel in sorted(expected - present))
        if problems:
            raise VolumeCorruptedError(
                f"version {self.version} ({self.name!r}) at {root} was modified after it was finalized: "
                + "; ".join(problems)
            )

    def stat_problem(self, rel: str, st: os.stat_result) -> str | None:
        """What file `rel`'s stat `st` shows changed since the version was sealed, or None (`verify` and a fork's
        `LocalVolumeStore.open_writer` check each file by it)."""
        entry = self._files[rel]
        if not stat.S_ISREG(st.st_mode):
            return f"{rel} is no longer a regular file"
        if st.st_size != entry.size:
            return f"{rel} is {st.st_size} bytes, its manifest says {entry.size}"
        if st.st_mtime_ns != self._manifest["mtimes_ns"][rel]:
            return f"{rel} was written after it was sealed (its mtime changed)"
        if st.st_mode & WRITE_BITS:
            return f"{rel} was made writable (mode {stat.S_IMODE(st.st_mode):o})"
        return None
