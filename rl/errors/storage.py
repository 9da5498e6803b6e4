"""The errors of what a run keeps: artifacts, volumes and the rollout buffer on them, the run directory's files, values
read from files someone else may have written, an action's identity.

Every class is re-exported by `rl.errors`: import it from there."""

from __future__ import annotations

from rl.errors import ArtifactError, UnsafeRunDirError, VolumeError

# raised in rl.identity


class UnhashableInputError(TypeError):
    """A value has no canonical form, so it cannot be part of an action's identity."""


# raised in rl.storage.artifacts


class ArtifactCorruptError(ArtifactError):
    """A stored artifact's files no longer hash to its digest (edited, truncated or partly deleted on disk)."""


class InvalidArtifactError(ArtifactError, ValueError):
    """An artifact to store, or a ref to look up, is malformed (bad path, non-bytes content, bad digest or name)."""


# raised in rl.storage.safe_fs


class LinkRefusedError(UnsafeRunDirError):
    """An entry below a tree's top is a symlink (or not the kind of file it must be): refused, never followed."""


# raised in rl.storage.volumes.buffer


class RowSchemaError(VolumeError, ValueError):
    """A row that is not one rollout of this iteration with a finite reward."""


class IterationExistsError(VolumeError):
    """An append of an iteration the buffer already holds with different rows."""


class IterationNotFoundError(VolumeError, LookupError):
    """A read of an iteration the version does not hold."""


# raised in rl.storage.volumes (the store)


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


# raised in rl.untrusted


class UntrustedValueError(ValueError):
    """What a file holds is not what this tool writes there; the message names the field."""
