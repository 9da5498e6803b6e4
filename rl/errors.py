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
    "GrpoInputError",
    "MissingAdapterError",
    "NonFiniteRewardError",
    "RetriesExhaustedError",
    "StaleBatchError",
]


class GrpoInputError(ValueError):
    """The run's configuration or prompts cannot work; nothing was started."""


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


class RetriesExhaustedError(RuntimeError):
    """A task failed on every attempt its retries allowed, or the driver was killed more often than it may retry.

    The run failed; what it finished is kept (Flyte's recover reuses it). The message names the task and what to do.
    """
