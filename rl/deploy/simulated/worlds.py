"""An in-memory `WorldStore` (rl.protocols) for the simulator: copy-on-write forks as overlays on a frozen parent.

Fault model: none of its own; it models the guarantees the agentic loop relies on, and refuses what breaks them.
- A sealed version is a read-only mapping and never changes; `seal` is content-addressed, so re-sealing the same files
  (a retried or cached `build_world`) returns the same version.
- A fork reads through to its parent and writes into its own overlay; siblings and the parent never see its writes.
- A fork has exactly one writer: forking a name again (a retried trial regenerating cleanly) retires the earlier fork of
  that name, whose later writes raise `RetiredWorkspaceError` — a dead attempt cannot scribble on its successor's world.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from rl.errors import RetiredWorkspaceError, UnknownVersionError
from rl.identity import content_digest


class MemoryWorkspace:
    """One trial's private copy: the parent's files plus this fork's own writes."""

    def __init__(self, store: MemoryWorlds, name: str, parent: str) -> None:
        self._store, self._name, self.parent = store, name, parent
        self._base = store.version_files(parent)
        self._own: dict[str, str] = {}
        self.state = "open"

    @property
    def name(self) -> str:
        return self._name

    def read_text(self, relpath: str) -> str:
        if relpath in self._own:
            return self._own[relpath]
        if relpath in self._base:
            return self._base[relpath]
        raise FileNotFoundError(f"{relpath} is not in fork {self._name} (forked from {self.parent})")

    def write_text(self, relpath: str, text: str) -> None:
        if self.state != "open":
            raise RetiredWorkspaceError(
                f"fork {self._name} is {self.state}; a fork has one writer — write into the newest fork of this name"
            )
        self._own[relpath] = text

    def files(self) -> dict[str, str]:
        """The fork's view: inherited files overlaid with its own writes."""
        return {**self._base, **self._own}

    def written(self) -> dict[str, str]:
        """Only what this fork wrote."""
        return dict(self._own)

    def finalize(self, message: str) -> str:
        if self.state != "open":
            raise RetiredWorkspaceError(f"fork {self._name} is {self.state}; only an open fork can be finalized")
        self.state = "finalized"
        return self._store.seal(self._name, self.files(), message)

    def abandon(self) -> None:
        if self.state == "open":
            self.state = "abandoned"


class MemoryWorlds:
    """Sealed versions by id, and the newest fork of each name (kept for inspection by tests)."""

    def __init__(self) -> None:
        self._versions: dict[str, Mapping[str, str]] = {}
        self.names: dict[str, str] = {}  # version -> the volume name it was sealed under
        self.forks: dict[str, MemoryWorkspace] = {}
        self.seals = 0

    def seal(self, name: str, files: Mapping[str, str], message: str) -> str:
        version = content_digest("world-version", name, dict(files))
        if version not in self._versions:
            self._versions[version] = MappingProxyType(dict(files))
            self.names[version] = name
        self.seals += 1
        return version

    def fork(self, version: str, name: str) -> MemoryWorkspace:
        self.version_files(version)  # refuse an unknown parent before anything changes
        previous = self.forks.get(name)
        if previous is not None and previous.state == "open":
            previous.state = "superseded"
        fork = self.forks[name] = MemoryWorkspace(self, name, version)
        return fork

    def read(self, version: str) -> dict[str, str]:
        return dict(self.version_files(version))

    def version_files(self, version: str) -> Mapping[str, str]:
        try:
            return self._versions[version]
        except KeyError:
            raise UnknownVersionError(
                f"no world version {version!r}; known versions: {len(self._versions)} — pass what seal() returned"
            ) from None
