"""Checking changed driver code against a recorded run: replay its history without executing any task, and report
the first action the new code issues that the history does not have."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rl.sim.records import ActionRecord, RunResult

if TYPE_CHECKING:
    from rl.sim.durable_sim import DurableSimulator


class ReplayDivergence(BaseException):
    """Changed driver code issued an action that the recorded history does not have."""

    def __init__(self, index: int, task: str, action_id: str, expected: ActionRecord | None) -> None:
        self.index, self.task, self.action_id, self.expected = index, task, action_id, expected
        want = f"{expected.task} ({expected.action_id})" if expected else "no further action"
        super().__init__(
            f"replay diverged at action #{index}: the code issued {task} ({action_id}) where the history has {want}; "
            "a run recorded with the old code would re-execute from here instead of resuming"
        )


@dataclass(frozen=True)
class ReplayReport:
    """What `check_replay` found: `ok`, or the first diverging action."""

    ok: bool
    matched: int
    divergence: ReplayDivergence | None = None


def check_replay(sim: DurableSimulator, recorded: RunResult, driver: Callable[..., Awaitable[Any]]) -> ReplayReport:
    """Run `driver` against `recorded`'s history without executing any task; report the first divergent action."""
    journal = sim._journals[recorded.run_id]
    result = sim._start(
        driver, dict(recorded.inputs), retries=0, crash_at=None, preload=dict(journal), strict=recorded.history
    )
    if isinstance(result.error, ReplayDivergence):
        return ReplayReport(ok=False, matched=result.error.index, divergence=result.error)
    if result.error is not None:
        raise result.error
    return ReplayReport(ok=True, matched=len(result.history))
