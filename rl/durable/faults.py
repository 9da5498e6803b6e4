"""Named fault injectors for the durable simulator, each with a documented probability and a seeded decision.

Every decision is a pure function of (plan seed, injector name, the place it applies to), never of a shared PRNG's
position, so a fault hits the same action on every run of a seed however the actions interleave.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass, replace


def _coin(seed: int, *where: object) -> float:
    """A uniform draw in [0, 1) determined by `seed` and `where` alone."""
    key = repr((seed, *where)).encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big") / 2**64


@dataclass(frozen=True)
class FaultPlan:
    """A seeded schedule of faults. All probabilities default to 0 (no faults).

    - `task_failure_p`: an attempt of a task raises `InjectedTaskFailure` — before its body runs, or (half the time)
      after it, so side effects happened but no result was recorded. Only attempts below the task's retry budget
      fail, so every task still succeeds within its retries.
    - `task_hang_p`: an attempt of a task with a timeout sleeps past it (a hung sandbox), so the timeout fires.
    - `driver_crash_p`: the driver is killed at an await point; at most `max_driver_crashes` per run.
    - `torn_checkpoint_p`: the driver is killed in the middle of a checkpoint write.
    - `exhaust_p`: an action of a task in `exhaust_tasks` (every task when empty) fails before its body on *every*
      attempt, its last included: an outage longer than its retry budget. The task runs out of retries and the run
      fails with a `RetriesExhaustedError`; `outage_over()` is the plan with the outage ended, for the liveness phase.
    - `fail_after_body`: scripted, not drawn: see the field.
    """

    seed: int = 0
    task_failure_p: float = 0.0
    task_hang_p: float = 0.0
    driver_crash_p: float = 0.0
    torn_checkpoint_p: float = 0.0
    max_driver_crashes: int = 3
    exhaust_p: float = 0.0
    exhaust_tasks: frozenset[str] = frozenset()
    fail_after_body: frozenset[str] = frozenset()
    """Tasks (by name) whose every action fails on attempt 0 *after* its body ran: the retry re-sends a request whose
    side effect already happened (a trainer that applied the update, a judge that was billed)."""

    def __post_init__(self) -> None:
        for name in ("task_failure_p", "task_hang_p", "driver_crash_p", "torn_checkpoint_p", "exhaust_p"):
            p = getattr(self, name)
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"FaultPlan.{name} must be a probability in [0, 1], got {p!r}")

    @functools.cached_property
    def task_faults(self) -> bool:
        """Whether `task_fault` can return a fault (a task rate above 0, or `fail_after_body`): if not, it is not asked.

        Cached in the instance, not a field: no digest, comparison or `replace` sees it."""
        return bool(self.task_failure_p or self.task_hang_p or self.exhaust_p or self.fail_after_body)

    def task_fault(self, task: str, action_id: str, attempt: int, retries: int) -> str | None:
        """'before', 'after', 'hang' or 'exhaust' (before, every attempt) for a faulted attempt; None if clean."""
        exhaustible = self.exhaust_p and (not self.exhaust_tasks or task in self.exhaust_tasks)
        if exhaustible and _coin(self.seed, "exhaust", action_id) < self.exhaust_p:
            return "exhaust"
        if attempt >= retries:
            return None
        if attempt == 0 and task in self.fail_after_body:
            return "after"
        # A zero rate skips its draw (a coin is never below 0): most swarm plans turn most kinds off.
        if self.task_failure_p and _coin(self.seed, "fail", action_id, attempt) < self.task_failure_p:
            return "before" if _coin(self.seed, "when", action_id, attempt) < 0.5 else "after"
        if self.task_hang_p and _coin(self.seed, "hang", action_id, attempt) < self.task_hang_p:
            return "hang"
        return None

    def outage_over(self) -> FaultPlan:
        """This plan after its outage: nothing exhausts retries any more; every other fault stays."""
        return replace(self, exhaust_p=0.0)

    def crash_driver(self, driver_attempt: int, point: int) -> bool:
        return bool(self.driver_crash_p) and _coin(self.seed, "crash", driver_attempt, point) < self.driver_crash_p

    def tear_checkpoint(self, driver_attempt: int, point: int) -> bool:
        return bool(self.torn_checkpoint_p) and _coin(self.seed, "tear", driver_attempt, point) < self.torn_checkpoint_p
