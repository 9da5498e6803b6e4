"""How a simulated run ends badly: the driver killed (`DriverCrash`, `DriverAttemptsExhausted`), a task out of retries
(`TaskFailed`), or the simulator used where it cannot model Flyte (`SimUsageError`)."""

from __future__ import annotations

from rl.errors import RetriesExhaustedError


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
