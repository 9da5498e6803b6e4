"""Versioned copy-on-write volumes on the local filesystem, and the rollout buffer built on them.

`LocalVolumeStore` implements `rl.protocols.VolumeVersion` / `WritableVolume` (the `ROVolume` / `Volume` roles of seeds
000 and 002) from plain directories; `VolumeBuffer` keeps one `iter-NNNNN.jsonl` per iteration on a chain of its
versions. docs/volumes.md says which filesystems get true copy-on-write and how it is guaranteed elsewhere.
"""

from __future__ import annotations

from rl.storage.volumes.buffer import (
    PANDAS_DTYPES,
    ROW_FIELDS,
    RescoreStats,
    RewardFn,
    VolumeBuffer,
    encode_rows,
    iteration_file,
    rollout_rows,
)
from rl.storage.volumes.filesystem import MIN_RACY_NS, RACY_NS, ShareMode, probe_share_mode, racy_window_ns
from rl.storage.volumes.manifest import FileEntry
from rl.storage.volumes.store import LocalVolumeStore
from rl.storage.volumes.version import LocalVolumeVersion
from rl.storage.volumes.writable import LocalWritableVolume

__all__ = [
    "MIN_RACY_NS",
    "PANDAS_DTYPES",
    "RACY_NS",
    "ROW_FIELDS",
    "FileEntry",
    "LocalVolumeStore",
    "LocalVolumeVersion",
    "LocalWritableVolume",
    "RescoreStats",
    "RewardFn",
    "ShareMode",
    "VolumeBuffer",
    "encode_rows",
    "iteration_file",
    "probe_share_mode",
    "racy_window_ns",
    "rollout_rows",
]
