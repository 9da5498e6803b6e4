"""A deterministic simulator of Flyte 2's durable execution, on a virtual clock: `DurableSimulator`.

What it models (and what Flyte's local mode does not), and which module of `rl.durable` holds each piece:
docs/simulator.md.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from rl.durable.attempts import Run, attempt_number
from rl.durable.checkpoint_store import SimCheckpointStore
from rl.durable.execution import SimTask, Tier
from rl.durable.faults import FaultPlan
from rl.durable.kernel import SimKernel
from rl.durable.records import ActionRecord, RunResult
from rl.durable.replay import ReplayReport, replay_report
from rl.durable.supervisor import supervise
from rl.durable.tracing import traced
from rl.durable.virtual_loop import LOOP_PATH, VirtualTimeLoop
from rl.seeding import derive_seed

T = TypeVar("T")


class DurableSimulator(SimKernel):
    """Runs async driver code under simulated Flyte durable semantics. One `seed` fixes every fault and interleaving.

    The shared state (event log, journals, task cache, faults) and its interface are the kernel's (`rl.durable.kernel`);
    this class declares tasks and runs drivers on it."""

    def __init__(
        self,
        seed: int = 0,
        faults: FaultPlan | None = None,
        *,
        atomic_checkpoints: bool = True,
        tie_break_seed: int | None = None,
        loop_path: str = LOOP_PATH,
    ) -> None:
        super().__init__(faults if faults is not None else FaultPlan(seed=seed), atomic_checkpoints=atomic_checkpoints)
        self.seed = seed
        self.tie_break_seed = tie_break_seed
        """None: ready tasks run first-in first-out; an int: each run's ties are shuffled by a seed derived from it."""
        self.loop_path = loop_path
        """Which iteration each run's virtual loop runs (`rl.durable.virtual_loop.loop_path`)."""
        self._runs = 0
        self._loop: VirtualTimeLoop | None = None

    # -- declaring tasks -------------------------------------------------------------------------------------------
    def task(
        self,
        fn: Callable[..., Awaitable[Any]] | None = None,
        *,
        name: str | None = None,
        retries: int = 0,
        cache: bool = False,
        timeout_s: float | None = None,
    ) -> Any:
        """Make `fn` a simulator task (usable as `@sim.task` or `@sim.task(retries=2)`)."""

        def wrap(f: Callable[..., Awaitable[Any]]) -> SimTask:
            return SimTask(self, f, name=name or f.__qualname__, retries=retries, cache=cache, timeout_s=timeout_s)

        return wrap(fn) if fn is not None else wrap

    def tier(self, obj: Any, name: str, **methods: dict[str, Any]) -> Any:
        """Wrap a protocol object so each named method is a task.

        `sim.tier(engine, "rollout", generate={"retries": 2})` makes `generate` the task `rollout.generate`.
        """
        return Tier(self.task, obj, name, methods)

    def trace(self, fn: Callable[..., Awaitable[T]] | None = None, *, name: str | None = None) -> Any:
        """Record a call's result inside a task attempt; a retry of that task replays it instead of calling again."""

        def wrap(f: Callable[..., Awaitable[T]]) -> Callable[..., Awaitable[T]]:
            return traced(self, f, name or f.__qualname__)

        return wrap(fn) if fn is not None else wrap

    def checkpoint_store(self) -> SimCheckpointStore:
        """The checkpoint of whichever run and driver calls it."""
        return SimCheckpointStore(self)

    @staticmethod
    def attempt_number() -> int:
        return attempt_number()

    def now(self) -> float:
        """Virtual seconds since the current run started."""
        return self._loop.time() if self._loop is not None else 0.0

    # -- running ---------------------------------------------------------------------------------------------------
    def run(
        self,
        driver: Callable[..., Awaitable[Any]],
        *,
        inputs: dict[str, Any] | None = None,
        retries: int = 0,
        crash_at: int | Sequence[int] | None = None,
    ) -> RunResult:
        """Run `driver(**inputs)` as a driver task with `retries`.

        `crash_at` kills the driver: an int at that await point of the first attempt, a sequence one point per attempt.
        """
        return self._start(driver, dict(inputs or {}), retries=retries, crash_at=crash_at)

    def rerun(
        self,
        previous: RunResult,
        *,
        driver: Callable[..., Awaitable[Any]],
        recover: bool = True,
        retries: int = 0,
        **changed: Any,
    ) -> RunResult:
        """Fork a finished run with changed inputs; with `recover`, every action of unchanged identity is reused."""
        unknown = set(changed) - set(previous.inputs)
        if unknown:
            raise ValueError(f"rerun got inputs the original run did not have: {sorted(unknown)}")
        inputs = {**previous.inputs, **changed}
        journal = self.journal(previous.run_id) if recover else None
        return self._start(driver, inputs, retries=retries, crash_at=None, recover_from=journal)

    def check_replay(self, recorded: RunResult, driver: Callable[..., Awaitable[Any]]) -> ReplayReport:
        """Run `driver` against `recorded`'s history without executing any task; report the first divergent action."""
        journal = self.journal(recorded.run_id)
        result = self._start(
            driver, dict(recorded.inputs), retries=0, crash_at=None, preload=dict(journal), strict=recorded.history
        )
        return replay_report(result)

    def _start(
        self,
        driver: Callable[..., Awaitable[Any]],
        inputs: dict[str, Any],
        *,
        retries: int,
        crash_at: int | Sequence[int] | None,
        recover_from: dict[str, Any] | None = None,
        preload: dict[str, Any] | None = None,
        strict: tuple[ActionRecord, ...] | None = None,
    ) -> RunResult:
        self._runs += 1
        ties = None if self.tie_break_seed is None else derive_seed("ties", self.tie_break_seed, self._runs)
        loop = VirtualTimeLoop(ties, self.loop_path)
        run = Run(f"run-{self._runs:04d}", driver, inputs, loop, recover_from=recover_from, strict_history=strict)
        if preload is not None:
            run.journal.update(preload)
        self.add_journal(run.run_id, run.journal)
        schedule = [crash_at] if isinstance(crash_at, int) else list(crash_at or [])
        self._loop = loop
        try:
            return loop.run_until_complete(supervise(self, run, retries, schedule))
        finally:
            self._loop = None
            loop.close()
