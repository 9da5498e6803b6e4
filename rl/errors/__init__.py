"""Every error this project raises on purpose, in one public package: import each from `rl.errors`.

`except rl.errors.RlError` catches every expected failure (bad input, a checkpoint or artifact that cannot be used, a
damaged volume, a tier that broke its contract; a full disk is an `OSError` instead); anything else is a bug. Each
family's `exit_code` is the `rl` command's exit status when that family ends it: docs/commands.md#exit-status. Each
keeps the builtin base it had (`ValueError`, `RuntimeError`, ...), so `except` clauses written against those still
catch it. The families and the errors a driver raises are here; the rest are in `rl.errors.storage`, `.models` and
`.drivers`, by what raises them (an injected fault, `DriverCrash` (a `BaseException`), a missing optional dependency
keep only their builtin base). The ground floor: it imports nothing else of `rl`. A fork's driver raises these (or
subclasses) so the same `except` clauses and laws hold for it (docs/conformance.md#the-errors-your-driver-raises).
"""

from __future__ import annotations

import unicodedata
from typing import ClassVar

__all__ = [
    "AdapterArtifactError",
    "AdapterDirError",
    "AdapterRefused",
    "ArtifactCorruptError",
    "ArtifactError",
    "ArtifactNotFoundError",
    "BatchError",
    "CheckpointConfigMismatchError",
    "CheckpointCorruptError",
    "CheckpointError",
    "CheckpointSchemaError",
    "CheckpointSealError",
    "ConfigError",
    "CudaUnavailableError",
    "DriverAttemptsExhausted",
    "DriverCrash",
    "EngineClosedError",
    "EngineContractError",
    "EngineOutputError",
    "EngineStartError",
    "FaultInputError",
    "FreshRefusedError",
    "GrpoInputError",
    "HistoryFileError",
    "ImplementationError",
    "IncompleteBufferError",
    "InjectedDriverCrash",
    "InjectedDriverFailure",
    "InjectedTaskFailure",
    "InputError",
    "InvalidArtifactError",
    "InvalidNameError",
    "InvalidPathError",
    "InvalidRolloutRequestError",
    "IterationExistsError",
    "IterationNotFoundError",
    "JudgeFlake",
    "JudgeOutage",
    "LedgerError",
    "LinkRefusedError",
    "MissingAdapterError",
    "ModelCacheError",
    "ModelDirError",
    "ModelFileError",
    "ModelMismatchError",
    "ModelSandboxError",
    "ModelSourceError",
    "NonFiniteLogitsError",
    "NonFiniteMetricError",
    "NonFiniteRewardError",
    "NotAnAdapterError",
    "NotInATaskError",
    "OptimizerStateError",
    "PlanDoesNotFitError",
    "PromptTooLongError",
    "RayUnavailableError",
    "RemoteOnlyError",
    "RetiredWorkspaceError",
    "RetriesExhaustedError",
    "RlError",
    "RolloutPlacementError",
    "RowSchemaError",
    "RunDirError",
    "RunLockedError",
    "SandboxFailure",
    "SharedFileModifiedError",
    "SimUsageError",
    "SimulationDeadlock",
    "StaleBatchError",
    "StepOutOfOrderError",
    "StepPayloadConflictError",
    "TaskFailed",
    "TierError",
    "TrainerError",
    "TrainerLedgerError",
    "TrainerMismatchError",
    "UnhashableInputError",
    "UnknownGpuError",
    "UnknownRewardError",
    "UnknownVersionError",
    "UnsafeRunDirError",
    "UnsupportedAsyncio",
    "UnsupportedFileError",
    "UnsupportedLora",
    "UntrustedValueError",
    "VLLMUnavailableError",
    "VersionNotFoundError",
    "VolumeCorruptedError",
    "VolumeError",
    "VolumeSealedError",
    "WriterConflictError",
    "shown",
]

VALUE_CHARS = 200
# Control, format (bidi overrides, zero-width), line/paragraph separators, lone surrogates (an undecodable file name).
_HIDDEN = frozenset(("Cc", "Cf", "Cs", "Zl", "Zp"))
_NAMED = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}


def shown(value: object, limit: int | None = VALUE_CHARS, *, keep: str = "") -> str:
    """`value` as text safe to print: every control or invisible character as its escape (`\\x1b`, `\\u202e`), all
    but those in `keep`; cut to `limit` characters. The one function every path or value read from a run directory
    goes through before it reaches a terminal, a log or the report: an escape sequence in a file name cannot set a
    terminal's title, clear it or forge a line, and a megabyte of name cannot flood it."""
    text = str(value)
    if not text.isprintable():
        text = "".join(
            c if c in keep or unicodedata.category(c) not in _HIDDEN else _NAMED.get(c) or _escape(ord(c)) for c in text
        )
    if limit is not None and len(text) > limit:
        text = f"{text[:limit]}… ({len(text) - limit} more characters)"
    return text


def _escape(code: int) -> str:
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


class RlError(Exception):
    """The root of every error this project raises on purpose; its message says what was wrong and what to do."""

    exit_code: ClassVar[int] = 9


class InputError(RlError, ValueError):
    """A flag, configuration, prompt source or name that cannot work; raised before anything was started."""

    exit_code = 2


class RolloutPlacementError(InputError):
    """A rollout engine put on a pod it cannot use: the torch sampler on a GPU pod (it has no device code, the GPU
    idles) or vLLM on a CPU pod; refused when the task environments are built or a run is submitted."""


class TrainerError(RlError, ValueError):
    """A train step's inputs cannot be used: a malformed batch, an adapter or optimizer state that is not one."""

    exit_code = 6


class BatchError(TrainerError):
    """A TrainBatch is malformed (lengths disagree, an empty completion, a version below 1, a stale rollout)."""


class TierError(RlError):
    """A tier (rollout engine, scorer) returned something the driver refuses; the iteration was not committed."""

    exit_code = 7


class LedgerError(RlError, ValueError):
    """The agentic trainer refused a step: applying it would break exactly-once training."""

    exit_code = 8


class GrpoInputError(InputError):
    """The run's configuration or prompts cannot work; nothing was started."""


class RunDirError(GrpoInputError):
    """The run directory cannot be used as asked; nothing in it was changed."""


class FreshRefusedError(RunDirError):
    """`--fresh` named a directory this tool did not create, so deleting it could delete someone's files."""


class UnsafeRunDirError(RunDirError):
    """An entry of the run directory is a symlink, a hard link, a FIFO, socket or device where a file goes: using it
    would read or write outside the run directory, or block."""


class RunLockedError(RunDirError, RuntimeError):
    """Another process is writing the run directory (its message names the holder); nothing was written."""


class IncompleteBufferError(InputError):
    """A run's rollout buffer misses iterations the run trained (its message lists them); nothing was re-scored."""


class NonFiniteMetricError(RlError, ValueError):
    """A value about to be written as JSON is NaN or an infinity (its message names the field); nothing was written."""


class NonFiniteRewardError(TierError, ValueError):
    """A reward is NaN or an infinity (a scorer returned it); nothing was trained on it or committed.

    The driver raises it for a scorer's reward, `rl.algorithm.advantages` (hence every trainer) for a reward it is
    given: one check, `rl.algorithm.checks.finite_rewards`. A `ValueError`, as an invalid argument of the advantage
    functions.
    """


class StaleBatchError(TierError, BatchError):
    """A rollout's policy version is newer than the version being trained, or older than `max_staleness` allows.

    One check (`rl.algorithm.checks.check_staleness`) for the driver and the trainers, so one type: a `TierError` to the
    driver's callers and a `BatchError` (a `TrainerError`, a `ValueError`) to a trainer's. Its fields name the rollout;
    it pickles from them, so it crosses process boundaries (DDP ranks, remote tasks) intact.
    """

    def __init__(
        self, index: int, rollout_version: int, trained_version: int, max_staleness: int, context: str = ""
    ) -> None:
        self.index, self.rollout_version, self.trained_version = index, rollout_version, trained_version
        self.staleness = trained_version - rollout_version
        self.max_staleness, self.context = max_staleness, context
        if self.staleness < 0:
            message = (
                f"rollout {index} claims policy version {rollout_version}, newer than the version being trained "
                f"({trained_version}); the batch's new_version or the rollout's version is wrong"
            )
        else:
            message = (
                f"rollout {index} was sampled from policy version {rollout_version} but this step trains version "
                f"{trained_version} (staleness {self.staleness} > max_staleness {max_staleness}); regenerate it from "
                "a newer adapter or raise max_staleness"
            )
        super().__init__(context + message)

    def __reduce__(self) -> tuple[type, tuple[int, int, int, int, str]]:
        return (
            type(self),
            (self.index, self.rollout_version, self.trained_version, self.max_staleness, self.context),
        )


class EngineContractError(TierError, RuntimeError):
    """A rollout engine returned something the protocol forbids (wrong count, version or group)."""


class NonFiniteLogitsError(TierError, RuntimeError):
    """The policy's next-token distribution holds NaN or an infinity (a diverged adapter or a broken model); nothing
    was sampled from it. Resume from an earlier checkpoint with a lower learning rate, or check the model's weights."""


class EngineClosedError(TierError, RuntimeError):
    """A rollout engine that cannot be used again after `close` refused a request (ours start again instead)."""


class EngineStartError(RlError, RuntimeError):
    """A rollout engine (vLLM) failed to start; the message carries its root cause (which vLLM logs in its engine
    process, not in the exception it raises) and what to change. Nothing was sampled."""


class CheckpointError(RlError, RuntimeError):
    """The driver's checkpoint cannot be resumed from."""

    exit_code = 3


class ArtifactError(RlError):
    """Base of the artifact store's errors (`rl.errors.storage` holds the subclasses)."""

    exit_code = 4


class ArtifactNotFoundError(ArtifactError, FileNotFoundError):
    """No artifact with the requested digest is stored here (deleted, or written by another store): every artifact
    store raises it, so a driver handles a lost artifact the same way whichever store it runs on."""


class VolumeError(RlError):
    """Base class of every error the volume layer raises (`rl.errors.storage` holds the subclasses)."""

    exit_code = 5


class CheckpointCorruptError(CheckpointError):
    """The blob is not a complete checkpoint (torn write, damaged storage, or not ours)."""


class CheckpointSealError(CheckpointCorruptError):
    """`RL_RUN_KEY` is set and the checkpoint's seal (an HMAC under that key) is missing or does not verify."""


class CheckpointSchemaError(CheckpointError):
    """The checkpoint was written by another schema version of this driver."""


class CheckpointConfigMismatchError(CheckpointError):
    """The checkpoint was written by a run with another configuration."""


class MissingAdapterError(CheckpointError):
    """The checkpoint names an adapter or optimizer state that the artifact store no longer has."""


class RetriesExhaustedError(RlError, RuntimeError):
    """A task failed on every attempt its retries allowed, or the driver was killed more often than it may retry.

    The run failed; what it finished is kept (Flyte's recover reuses it). The message names the task and what to do.
    """


def families() -> dict[str, int]:
    """Each family's name and the exit status the `rl` command ends with when an error of that family stops it."""
    classes: list[type[RlError]] = [
        InputError,
        CheckpointError,
        ArtifactError,
        VolumeError,
        TrainerError,
        TierError,
        LedgerError,
        RlError,
    ]
    return {cls.__name__: cls.exit_code for cls in classes}


class AgenticInputError(InputError):
    """The agentic run's shape cannot work (`rl.loop.agentic.AgenticConfig`); nothing was started."""


__all__ += ["AgenticInputError"]


class SamplingSettingsError(InputError):
    """A temperature, top-p or top-k that no sampler can use (`rl.types.SamplingSettings`); nothing was sampled."""


__all__ += ["SamplingSettingsError"]


class VLLMSamplingError(SamplingSettingsError):
    """Sampling settings valid in general that vLLM cannot sample as declared (a temperature below its greedy
    threshold or above its maximum); the message names the setting and what to use. Nothing was sampled."""


__all__ += ["VLLMSamplingError"]


class RankFailedError(RlError, RuntimeError):
    """A step of a process group failed on one or more ranks; every rank raises it at the same agreement point
    (`rl.trainer.rank_agreement`), so none is left waiting in a collective, and nothing was saved. Its message names
    the failed ranks and each one's error (type and message); a failed rank's own error is its `__cause__`. It pickles
    from its fields, so it crosses process boundaries (spawned ranks, remote tasks) intact."""

    def __init__(
        self,
        rank: int,
        world_size: int,
        where: str,
        failures: tuple[tuple[int, str], ...] = (),
        collective_error: str = "",
    ) -> None:
        self.rank, self.world_size, self.where = rank, world_size, where
        self.failures, self.collective_error = tuple(failures), collective_error
        head = f"rank {rank} of {world_size}: the step failed while {where}"
        if failures:
            if len(self.failures) == 1:
                ranks, each = f"rank {self.failures[0][0]}", self.failures[0][1]
            else:
                ranks = f"ranks {', '.join(str(r) for r in self.failed_ranks)}"
                each = "; ".join(f"rank {r}: {error}" for r, error in self.failures)
            oom = any("OutOfMemoryError" in error or "out of memory" in error for _, error in self.failures)
            hint = (
                " (out of memory: lower the trainer's micro_batch_size, or turn on gradient_checkpointing)"
                if oom
                else ""
            )
            message = (
                f"{head} on {ranks} ({each}){hint}; every rank stopped "
                "there and nothing was saved. Fix that rank's error (its log has the traceback) and run the step again"
            )
        else:
            message = (
                f"{head}: its collective failed ({collective_error}): a peer rank died (killed, out of host memory) "
                "or failed inside it, or its connection dropped; nothing was saved. The other ranks' logs say which"
            )
        super().__init__(message)

    @property
    def failed_ranks(self) -> tuple[int, ...]:
        """The ranks whose own step failed (empty when the agreement's collective itself failed)."""
        return tuple(r for r, _ in self.failures)

    def __reduce__(self) -> tuple[type, tuple[int, int, str, tuple[tuple[int, str], ...], str]]:
        return (type(self), (self.rank, self.world_size, self.where, self.failures, self.collective_error))


__all__ += ["RankFailedError"]


# The other errors, in one module per concern, each beside the families it subclasses: imported last, because they
# import those families from here.
from rl.errors.drivers import (  # noqa: E402
    ConfigError,
    DriverAttemptsExhausted,
    DriverCrash,
    FaultInputError,
    HistoryFileError,
    ImplementationError,
    InjectedDriverCrash,
    InjectedDriverFailure,
    InjectedTaskFailure,
    JudgeFlake,
    JudgeOutage,
    NotInATaskError,
    RayUnavailableError,
    RemoteOnlyError,
    RetiredWorkspaceError,
    SandboxFailure,
    SimulationDeadlock,
    SimUsageError,
    StepOutOfOrderError,
    StepPayloadConflictError,
    TaskFailed,
    TrainerLedgerError,
    TrainerMismatchError,
    UnknownRewardError,
    UnknownVersionError,
    UnsupportedAsyncio,
)
from rl.errors.models import (  # noqa: E402
    AdapterArtifactError,
    AdapterDirError,
    AdapterRefused,
    CudaUnavailableError,
    EngineOutputError,
    InvalidRolloutRequestError,
    ModelCacheError,
    ModelDirError,
    ModelFileError,
    ModelMismatchError,
    ModelSandboxError,
    ModelSourceError,
    NotAnAdapterError,
    OptimizerStateError,
    PlanDoesNotFitError,
    PromptTooLongError,
    UnknownGpuError,
    UnsupportedLora,
    VLLMUnavailableError,
)
from rl.errors.storage import (  # noqa: E402
    ArtifactCorruptError,
    InvalidArtifactError,
    InvalidNameError,
    InvalidPathError,
    IterationExistsError,
    IterationNotFoundError,
    LinkRefusedError,
    RowSchemaError,
    SharedFileModifiedError,
    UnhashableInputError,
    UnsupportedFileError,
    UntrustedValueError,
    VersionNotFoundError,
    VolumeCorruptedError,
    VolumeSealedError,
    WriterConflictError,
)
