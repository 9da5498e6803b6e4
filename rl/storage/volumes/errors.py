"""The errors of the volume layer: a subclass of `rl.errors.VolumeError` (exit code 5, re-exported here) per way to
misuse or damage a store."""

from __future__ import annotations

from rl.errors import VolumeError

__all__ = [
    "InvalidNameError",
    "InvalidPathError",
    "SharedFileModifiedError",
    "UnsupportedFileError",
    "VersionNotFoundError",
    "VolumeCorruptedError",
    "VolumeError",
    "VolumeSealedError",
    "WriterConflictError",
]


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
