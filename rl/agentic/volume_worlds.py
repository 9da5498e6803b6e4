"""Where worlds live on volumes: a sealed version per world, and a private copy-on-write fork per trial (the agentic
tutorial's volumes). `rl.agentic.world` builds a world's files; this module stores them.

The sandbox tier needs three things of a store, so that is the whole `WorldStore` protocol (in `rl.protocols`): seal a
world's files into an immutable version, fork a version into a writable `Workspace` that only its trial writes, and read
a version back. The parent never changes: a trial writes only into its fork.

Two implementations:
- `VolumeWorlds` (here) over any volume store shaped like `rl.protocols.VolumeVersion` / `WritableVolume` — the local
  copy-on-write volumes of `rl.storage.volumes.LocalVolumeStore` outside the simulator, Union volumes in production;
- `rl.deploy.simulated.worlds.MemoryWorlds`, an in-memory copy-on-write overlay, for the simulator (no disk,
  microseconds).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

from rl.protocols import VolumeVersion, Workspace, WritableVolume


class VolumeStoreLike(Protocol):
    """What `VolumeWorlds` needs of a volume store (`rl.storage.volumes.LocalVolumeStore` has it)."""

    def new(self, name: str) -> WritableVolume: ...

    def open(self, name_or_version: str) -> VolumeVersion: ...


class _VolumeWorkspace:
    """A `Workspace` over a forked writable volume, reading and writing through its mount."""

    def __init__(self, volume: WritableVolume) -> None:
        self._volume = volume
        self._root = volume.mount()

    @property
    def name(self) -> str:
        return self._volume.name

    def read_text(self, relpath: str) -> str:
        return (self._root / relpath).read_text()

    def write_text(self, relpath: str, text: str) -> None:
        own_writer = getattr(self._volume, "write_text", None)
        if callable(own_writer):  # the volume's own write keeps copy-on-write for inherited files
            own_writer(relpath, text)
            return
        path = self._root / relpath
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)

    def finalize(self, message: str) -> str:
        return self._volume.finalize(message).version

    def abandon(self) -> None:
        abandon = getattr(self._volume, "abandon", None)
        if callable(abandon):
            abandon()


class VolumeWorlds:
    """A `WorldStore` on real copy-on-write volumes: `VolumeWorlds(LocalVolumeStore(root))` outside the simulator."""

    def __init__(self, volumes: VolumeStoreLike) -> None:
        self.volumes = volumes

    def seal(self, name: str, files: Mapping[str, str], message: str) -> str:
        volume = self.volumes.new(name)
        workspace = _VolumeWorkspace(volume)
        try:
            for relpath, text in sorted(files.items()):
                workspace.write_text(relpath, text)
        except BaseException:
            workspace.abandon()
            raise
        return workspace.finalize(message)

    def fork(self, version: str, name: str) -> Workspace:
        return _VolumeWorkspace(self.volumes.open(version).fork(name))

    def read(self, version: str) -> dict[str, str]:
        root = self.volumes.open(version).path()
        return {p.relative_to(root).as_posix(): p.read_text() for p in sorted(root.rglob("*")) if _is_file(p)}


def _is_file(path: Path) -> bool:
    return path.is_file() and not path.is_symlink()
