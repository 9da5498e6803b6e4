"""Checking changed driver code against a recorded run: replay its history without executing any task, and report
the first action the new code issues that the history does not have."""

from __future__ import annotations

from dataclasses import dataclass

from rl.durable.records import ActionRecord, RunResult


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


def replay_report(result: RunResult) -> ReplayReport:
    """What a strict replay's run (`DurableSimulator.check_replay`) found: ok, or the first divergent action."""
    if isinstance(result.error, ReplayDivergence):
        return ReplayReport(ok=False, matched=result.error.index, divergence=result.error)
    if result.error is not None:
        raise result.error
    return ReplayReport(ok=True, matched=len(result.history))
