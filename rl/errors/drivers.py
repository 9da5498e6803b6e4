"""The errors of the drivers and where they run: the durable-execution engine and its injected faults, the agentic
loop's tiers and ledger, the Flyte and simulated deployments, rewards, the conformance suite's bindings.

Every class is re-exported by `rl.errors`: import it from there."""

from __future__ import annotations

from rl.errors import InputError, LedgerError, RetriesExhaustedError

# raised in rl.agentic.bandit


class TrainerLedgerError(LedgerError):
    """A step the trainer must not apply."""


class StepPayloadConflictError(TrainerLedgerError):
    """A step id already applied arrived with a different payload (rewards, their order, or lr)."""

    def __init__(self, step: int, applied_digest: str, new_digest: str) -> None:
        self.step, self.applied_digest, self.new_digest = step, applied_digest, new_digest
        super().__init__(
            f"step {step} was already applied with payload {applied_digest}, and now arrived with payload "
            f"{new_digest}; "
            "refusing a second update. A re-executed step must carry the same rewards in the same order: canonicalise "
            "step inputs (sort rewards by trial id) so a replayed step hashes identically"
        )

    def __reduce__(self) -> tuple[type[StepPayloadConflictError], tuple[int, str, str]]:
        # picklable, so it crosses process boundaries (a Ray actor, a Flyte task) as itself
        return (type(self), (self.step, self.applied_digest, self.new_digest))


class StepOutOfOrderError(TrainerLedgerError):
    """A step arrived before the steps it follows were applied."""


class TrainerMismatchError(LedgerError):
    """An existing trainer was attached for other worlds than it was created for."""


# raised in rl.agentic.faults


class SandboxFailure(RuntimeError):
    """The trial's sandbox died (injected on attempt 0, or a dead trial on every attempt); a retry regenerates it."""


class JudgeFlake(RuntimeError):
    """A post-judge failure (say, the reward's upload) injected on attempt 0; the retry must not re-call the judge."""


class JudgeOutage(RuntimeError):
    """The judging of a trial fails on every attempt (its judge is down for it): the driver must skip the trial."""


class InjectedDriverCrash(RuntimeError):
    """The tutorial's `crash_driver_at_step`: driver attempt 0 dies right after that step; the retry must replay it."""


class FaultInputError(InputError):
    """A fault knob that cannot work with the run; nothing was started."""


# raised in rl.agentic.ray_trainer


class RayUnavailableError(ImportError):
    """Ray is not installed; install the extra: `pip install -e .[ray]`."""


# raised in rl.conformance.implementation


class ImplementationError(ValueError):
    """`--rl-impl` does not name a usable implementation."""


# raised in rl.conformance.recorded_history


class HistoryFileError(ValueError):
    """A recorded-history file that cannot be used: unreadable, another schema, or missing a mode."""


# raised in rl.deploy.flyte.agentic


class RemoteOnlyError(RuntimeError):
    """A feature that Flyte's local mode does not provide was asked for in local mode."""


# raised in rl.deploy.flyte.bindings


class NotInATaskError(RuntimeError):
    """A Flyte-backed store was used outside a running Flyte task."""


# raised in rl.deploy.flyte.checkpoint_store


class InjectedDriverFailure(RuntimeError):
    """The driver's planned crash (`FaultSpec`): the retried attempt must resume from the checkpoint."""


# raised in rl.deploy.flyte.strict


class ConfigError(InputError):
    """A run configuration that cannot work; raised before any task starts."""


# raised in rl.deploy.simulated.worlds


class UnknownVersionError(LookupError):
    """No world version has this id; fork or read a version that `seal` returned."""


class RetiredWorkspaceError(RuntimeError):
    """A write to a fork that was sealed, abandoned or superseded by a newer fork of its name."""


# raised in rl.durable (the engine itself)


class DriverCrash(BaseException):
    """The simulated driver process died. A BaseException so that a driver's `except Exception` cannot swallow it."""


class TaskFailed(RetriesExhaustedError):
    """A task failed on every attempt its retries allowed."""

    def __init__(self, task: str, action_id: str, attempts: int, cause: BaseException) -> None:
        self.task, self.action_id, self.attempts, self.cause = task, action_id, attempts, cause
        super().__init__(
            f"task {task} ({action_id}) failed after {attempts} attempt(s), its retries exhausted: {cause!r}; the "
            "run's finished actions are kept: fix the cause, then rerun with recover=True to resume from them"
        )


class DriverAttemptsExhausted(DriverCrash, RetriesExhaustedError):
    """The driver was killed on its last allowed attempt: the run is over, its finished actions and checkpoint kept."""

    def __init__(self, attempts: int, last: BaseException) -> None:
        self.attempts, self.last = attempts, last
        super().__init__(
            f"the driver task was killed on all {attempts} attempt(s) its retries allowed (last: {last}); the run's "
            "finished actions are kept: rerun with recover=True, or give the driver more retries"
        )


class SimUsageError(RuntimeError):
    """The simulator was used in a way it cannot model (say, a task called outside `DurableSimulator.run`)."""


# raised in rl.durable.faults


class InjectedTaskFailure(RuntimeError):
    """A task attempt failed because the fault plan said so (a dead sandbox, a lost upload)."""


# raised in rl.durable.virtual_loop


class SimulationDeadlock(RuntimeError):
    """Every task is waiting and no timer is pending: nothing can ever make progress."""


class UnsupportedAsyncio(RuntimeError):
    """This Python's asyncio loop iteration is one the virtual loop cannot drive."""


# raised in rl.rewards


class UnknownRewardError(InputError, KeyError):
    """No reward is registered under the requested name; the message lists the names that are."""

    def __init__(self, name: str, known: list[str]) -> None:
        super().__init__(name)
        self.name = name
        self.known = known

    def __str__(self) -> str:
        # KeyError's own __str__ would print only repr(name); say what the valid choices are.
        return f"unknown reward {self.name!r}; known rewards: {', '.join(self.known)}"
