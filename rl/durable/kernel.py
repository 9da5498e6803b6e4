"""The simulator's kernel, `SimKernel`: the state every piece of `rl.durable` shares, behind a public interface.

The event log (`log`), the current driver attempt (`require_driver`), each run's journal of recorded actions
(`journal`, `add_journal`) and the cache of task results across runs (`cached`, `cache_result`), with the seeded
faults and what fired. `DurableSimulator` is a kernel that also declares tasks and runs drivers; its satellites
(`execution`, `supervisor`, `tracing`, `checkpoint_store`, `replay`) are handed the kernel and use only this interface,
so none of them imports `durable_sim` and none touches another module's privates.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from rl.durable.attempts import CURRENT_DRIVER, DriverAttempt
from rl.durable.faults import FaultPlan
from rl.durable.records import Event, new_event
from rl.errors import SimUsageError


class SimKernel:
    """The shared state of one simulator: its faults, the events it logged, its runs' journals and its task cache."""

    def __init__(self, faults: FaultPlan, *, atomic_checkpoints: bool) -> None:
        self.faults = faults
        self.atomic_checkpoints = atomic_checkpoints
        self.fired: Counter[str] = Counter()
        """Faults that fired, by kind (task_failure, task_hang, exhausted_task, driver_crash, torn_checkpoint)."""
        self.events: list[Event] = []
        self._cache: dict[tuple[str, str], Any] = {}
        self._journals: dict[str, dict[str, Any]] = {}

    # -- the driver context ----------------------------------------------------------------------------------------
    def require_driver(self, what: str) -> DriverAttempt:
        """The driver attempt running the caller; `what` (e.g. "checkpoint.save") names the call in the error."""
        driver = CURRENT_DRIVER.get()
        if driver is None:
            raise SimUsageError(f"{what} was used outside DurableSimulator.run(); start a run first")
        return driver

    # -- the event log ---------------------------------------------------------------------------------------------
    def log(self, driver: DriverAttempt, kind: str, task: str = "", action: str = "", detail: str = "") -> None:
        """Append an event at `driver`'s run's virtual time."""
        run = driver.run
        self.events.append(new_event((run.loop.time(), run.run_id, driver.number, kind, task, action, detail)))

    def log_lines(self) -> list[str]:
        return [e.line() for e in self.events]

    def count(self, kind: str, task: str | None = None, run: str | None = None) -> int:
        """How many events of `kind` (optionally for one task and one run) the log holds."""
        return sum(1 for e in self.events if e.kind == kind and task in (None, e.task) and run in (None, e.run))

    # -- journals --------------------------------------------------------------------------------------------------
    def add_journal(self, run_id: str, journal: dict[str, Any]) -> None:
        """Keep `run_id`'s journal (action id -> record, filled in as the run goes) for reruns and replays."""
        self._journals[run_id] = journal

    def journal(self, run_id: str) -> dict[str, Any]:
        """The journal of the run `run_id`: its recorded actions by action id (the live mapping, not a copy)."""
        return self._journals[run_id]

    # -- the task cache --------------------------------------------------------------------------------------------
    def has_cached(self, task: str, digest: str) -> bool:
        """Whether a cached task `task` stored a result for inputs of `digest` (in any run of this simulator)."""
        return (task, digest) in self._cache

    def cached(self, task: str, digest: str) -> Any:
        """The record a cached task `task` stored for inputs of `digest`; KeyError if none (ask `has_cached`)."""
        return self._cache[(task, digest)]

    def cache_result(self, task: str, digest: str, record: Any) -> None:
        self._cache[(task, digest)] = record
