"""A volume store that trusts an unchanged stat with no racy window: the in-place rewrite law must fail it, and only it.

`StatTrustingStore` is `broken_volumes.DirStore` made fast the way git's index is: a fork hard-links its parent's files
instead of copying them, and finalize reuses the parent's digest for any file whose inode, size and mtime are what the
fork saw, reading only the rest. It skips git's "racy clean" rule, so a file rewritten in place within one timestamp
step (same size, mtime unchanged) is published under its parent's digest: the version's id names the old content.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import weakref
from pathlib import Path

from broken_volumes import _COUNT, _NAME, DirStore, DirVersion, DirWriter, _files

from rl.conformance import Implementation

Seen = dict[str, tuple[tuple[int, int, int], str]]
"""Per file of a fork: (inode, size, mtime_ns) when forked, and the parent's digest of it."""


class StatTrustingWriter(DirWriter):
    seen: Seen

    def finalize(self, message: str) -> DirVersion:
        mount = self.mount()
        self.store.check_tree(mount)
        files = {}
        for p in sorted(mount.rglob("*")):
            if p.is_file():
                rel, st = p.relative_to(mount).as_posix(), os.stat(p)
                known = self.seen.get(rel)
                if known is not None and known[0] == (st.st_ino, st.st_size, st.st_mtime_ns):
                    files[rel] = known[1]  # the bug: trusted whatever its mtime's age
                else:
                    files[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
        identity = {"name": self._name, "parent": self.parent and self.parent.version, "message": message}
        version = self.store.version_id({**identity, "files": files})
        target = self.store.root / "versions" / version
        if not target.exists():
            self.store.publish(self, target, {**identity, "seq": next(_COUNT)})
        self.store.discard(self)
        self.closed = True
        return DirVersion(self.store, version)


class StatTrustingStore(DirStore):
    """Forks hard-link their parent's files; finalize trusts (inode, size, mtime) with no racy window."""

    def writer(self, name: str, parent: DirVersion | None) -> DirWriter:
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise ValueError(f"bad volume name {name!r}")
        self.check_no_writer(name)
        writer = StatTrustingWriter(self, name, parent, self.populate(name, parent))
        writer.seen = self.stats(writer.mount()) if parent is not None else {}
        self.writers[name] = weakref.ref(writer)
        return writer

    def populate(self, name: str, parent: DirVersion | None) -> Path:
        if parent is None:
            return super().populate(name, parent)
        staging = self.root / "staging" / name
        shutil.rmtree(staging, ignore_errors=True)
        shutil.copytree(parent.path(), staging, copy_function=os.link)
        return staging

    @staticmethod
    def stats(mount: Path) -> Seen:
        seen: Seen = {}
        for rel, digest in _files(mount).items():
            st = os.stat(mount / rel)
            seen[rel] = ((st.st_ino, st.st_size, st.st_mtime_ns), digest)
        return seen


STAT_TRUSTING = Implementation(name="stat-trusting", volume_store=StatTrustingStore)
