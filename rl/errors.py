"""The errors a GRPO driver raises where the conformance suite checks them, in one public module.

A fork's driver raises these (or subclasses) so that the same `except` clauses, and the same laws, hold for it:
`rl.conformance`'s driver laws expect `NonFiniteRewardError` for a NaN reward, and a resume from a checkpoint that
cannot be resumed is a `CheckpointError` whose type says why. Each message says what to do next.
"""

from __future__ import annotations

__all__ = [
    "CheckpointConfigMismatchError",
    "CheckpointCorruptError",
    "CheckpointError",
    "CheckpointSchemaError",
    "EngineContractError",
    "FreshRefusedError",
    "GrpoInputError",
    "IncompleteBufferError",
    "MissingAdapterError",
    "NonFiniteMetricError",
    "NonFiniteRewardError",
    "RunDirError",
    "RunLockedError",
    "StaleBatchError",
    "UnsafeRunDirError",
]


class GrpoInputError(ValueError):
    """The run's configuration or prompts cannot work; nothing was started."""


class RunDirError(GrpoInputError):
    """The run directory cannot be used as asked; nothing in it was changed."""


class FreshRefusedError(RunDirError):
    """`--fresh` named a directory this tool did not create, so deleting it could delete someone's files."""


class UnsafeRunDirError(RunDirError):
    """An entry of the run directory is a symlink, so using it would read or write outside the run directory."""


class NonFiniteRewardError(ValueError):
    """A scorer returned NaN or an infinity; the iteration was not committed."""


class StaleBatchError(ValueError):
    """A batch holds rollouts further behind the trained policy than `max_staleness` allows."""


class EngineContractError(RuntimeError):
    """A rollout engine returned something the protocol forbids (wrong count, version or group)."""


class CheckpointError(RuntimeError):
    """The driver's checkpoint cannot be resumed from."""


class CheckpointCorruptError(CheckpointError):
    """The blob is not a complete checkpoint (torn write, damaged storage, or not ours)."""


class CheckpointSchemaError(CheckpointError):
    """The checkpoint was written by another schema version of this driver."""


class CheckpointConfigMismatchError(CheckpointError):
    """The checkpoint was written by a run with another configuration."""


class MissingAdapterError(CheckpointError):
    """The checkpoint names an adapter or optimizer state that the artifact store no longer has."""


class RunLockedError(RuntimeError):
    """Another process is writing the run directory (its message names the holder); nothing was written."""


class IncompleteBufferError(ValueError):
    """A run's rollout buffer misses iterations the run trained (its message lists them); nothing was re-scored."""


class NonFiniteMetricError(ValueError):
    """A value about to be written as JSON is NaN or an infinity (its message names the field); nothing was written."""
