"""A deterministic simulator of Flyte 2's durable execution, on a virtual clock.

Flyte's local mode runs tasks but not the remote semantics the loops rely on (see DESIGN.md). This module
reproduces them:

- every task call is an *action* whose identity is a content hash of (calling scope, task name, inputs, occurrence);
  a retried driver *replays* the actions that completed in earlier attempts and runs the rest (seed 002: "completed
  child actions are not re-executed: the retry replays them from the durable record");
- `retries=N` per task, with the attempt number visible to the task (`attempt_number()`);
- `trace`: a call inside a task is recorded and replayed when that task retries (the judge is billed once);
- `cache=True` returns an earlier result of a pure task, across runs of one simulator;
- a checkpoint store that belongs to one run's driver attempts (a new run starts fresh);
- `rerun(run, recover=True, **changed)`: a new run reusing every action of the old one whose identity is unchanged;
- inputs and outputs are copied at every boundary, so a consumer cannot mutate a producer's value (`flyte.io.Dir`);
- `timeout_s` per task, on the virtual clock;
- crash injection: kill the driver at its N-th await point, or follow a seeded `FaultPlan` (`fired` counts, by kind,
  the faults that really fired); a task out of retries fails as `TaskFailed`, a driver killed on its last attempt as
  `DriverAttemptsExhausted`, both `rl.errors.RetriesExhaustedError`s that name what ran out and what to do;
- `tie_break_seed`: tasks ready at the same virtual instant run in an order drawn from it (FIFO without it);
- an event log that is identical byte for byte for the same seed (fault firings included: `fault.task`);
- `check_replay`: run changed driver code against a recorded history and report the first diverging action.

Public surface: `DurableSimulator`, `RunResult`, `ReplayReport`, `attempt_number`, `run_name`, and the exceptions below.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import hashlib
import inspect
import pickle
from collections import Counter
from collections.abc import Awaitable, Callable, Collection, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, TypeVar

from rl.errors import RetriesExhaustedError
from rl.identity import content_digest
from rl.seeding import derive_seed
from rl.sim.faults import FaultPlan, InjectedTaskFailure
from rl.sim.virtual_loop import VirtualTimeLoop

T = TypeVar("T")


class DriverCrash(BaseException):
    """The simulated driver process died. A BaseException so that a driver's `except Exception` cannot swallow it."""


class ReplayDivergence(BaseException):
    """Changed driver code issued an action that the recorded history does not have."""

    def __init__(self, index: int, task: str, action_id: str, expected: ActionRecord | None) -> None:
        self.index, self.task, self.action_id, self.expected = index, task, action_id, expected
        want = f"{expected.task} ({expected.action_id})" if expected else "no further action"
        super().__init__(
            f"replay diverged at action #{index}: the code issued {task} ({action_id}) where the history has {want}; "
            "a run recorded with the old code would re-execute from here instead of resuming"
        )


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


@dataclass(frozen=True)
class Event:
    """One line of the event log. `t` is virtual seconds since the run started."""

    t: float
    run: str
    attempt: int
    kind: str
    task: str = ""
    action: str = ""
    detail: str = ""

    def line(self) -> str:
        text = f"{self.t:014.6f} {self.run} d{self.attempt} {self.kind:<18} {self.task} {self.action} {self.detail}"
        return text.rstrip()


@dataclass(frozen=True)
class ActionRecord:
    """An action as issued by the driver: its identity and its task."""

    action_id: str
    task: str


@dataclass(frozen=True)
class RunResult:
    """The outcome of one simulated run. `error` is the user's code failing; divergence lives in `ReplayReport`."""

    run_id: str
    inputs: dict[str, Any]
    output: Any
    error: BaseException | None
    attempts: int
    crashes: int
    await_points: int
    history: tuple[ActionRecord, ...]
    virtual_time_s: float

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(frozen=True)
class ReplayReport:
    """What `check_replay` found: `ok`, or the first diverging action."""

    ok: bool
    matched: int
    divergence: ReplayDivergence | None = None


@dataclass
class _Run:
    run_id: str
    driver: Callable[..., Awaitable[Any]]
    inputs: dict[str, Any]
    loop: VirtualTimeLoop
    journal: dict[str, Any] = field(default_factory=dict)
    traces: dict[tuple[str, str, str, int], Any] = field(default_factory=dict)
    checkpoint: bytes | None = None
    recover_from: dict[str, Any] | None = None
    failures: dict[str, TaskFailed] = field(default_factory=dict)
    inflight: dict[str, asyncio.Future[Any]] = field(default_factory=dict)
    strict_history: tuple[ActionRecord, ...] | None = None
    crashes: int = 0
    dead_tasks: list[asyncio.Task[Any]] = field(default_factory=list)
    """Tasks a killed attempt ended (`_dies_with_the_attempt`)."""


@dataclass
class _DriverAttempt:
    run: _Run
    number: int
    crash_at: int | None
    points: int = 0
    crashed: bool = False
    occurrences: Counter[tuple[str, str]] = field(default_factory=Counter)
    issued: list[ActionRecord] = field(default_factory=list)
    supervisor: asyncio.Task[Any] | None = None
    divergence: ReplayDivergence | None = None
    killer: asyncio.Task[Any] | None = None


@dataclass
class _TaskAttempt:
    action_id: str
    attempt: int
    trace_occurrences: Counter[tuple[str, str]] = field(default_factory=Counter)


_FAULT_KIND = {"before": "task_failure", "after": "task_failure", "hang": "task_hang", "exhaust": "exhausted_task"}
"""A task fault as `DurableSimulator.fired` counts it."""

_DRIVER: ContextVar[_DriverAttempt | None] = ContextVar("rl_sim_driver", default=None)
_TASK: ContextVar[_TaskAttempt | None] = ContextVar("rl_sim_task", default=None)


def attempt_number() -> int:
    """The attempt number of the task this code runs in (0 for the first), as FLYTE_ATTEMPT_NUMBER is remotely.

    The driver is a task too: called from driver code (outside any child task) it is the driver's attempt number.
    """
    task = _TASK.get()
    if task is not None:
        return task.attempt
    driver = _DRIVER.get()
    return driver.number if driver is not None else 0


def run_name() -> str:
    """The id of the run this code runs in (`flyte.ctx().action.run_name` remotely); "" outside a run."""
    driver = _DRIVER.get()
    return driver.run.run_id if driver is not None else ""


class _Unpicklable:
    """A record of a value pickle can't take (a class defined inside a function): kept as a private deep copy."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = copy.deepcopy(value)


def _loop_tasks() -> list[asyncio.Task[Any]]:
    """The running loop's unfinished tasks, in creation order on the virtual loop (so a kill's cancellations, and the
    event log after it, are the same on every run of a seed)."""
    loop = asyncio.get_running_loop()
    return loop.tasks_in_creation_order() if isinstance(loop, VirtualTimeLoop) else list(asyncio.all_tasks(loop))


def _retrieve(execution: asyncio.Future[Any]) -> None:
    """Mark an action's failure as seen: an orphaned action may fail with nobody left awaiting it."""
    if not execution.cancelled():
        execution.exception()


def _dies_with_the_attempt(driver: _DriverAttempt, task: asyncio.Task[Any] | None) -> None:
    """Note a task the attempt's death ends: the run marks the failure it ends with as seen (`_bury`).

    A killed attempt's code unwinds with whatever its awaits raise: a `finally` that calls a task gets "attempt is
    dead", and a task awaiting a gather that holds the killing task can end with its `DriverCrash`. Nothing awaits
    either any more. Remotely that code died with its process; here asyncio would report "Task exception was never
    retrieved" from the task's finalizer, whenever the garbage collector reaches it. On CPython 3.11.7 and 3.12.1 that
    report (a traceback, formatted with `ast.parse`) can land inside another `ast.parse`, pytest's, which then fails
    with "AST constructor recursion depth mismatch" (cpython gh-106905, fixed in 3.11.8 and 3.12.2): the conformance
    self-test's in-process suite run died of an INTERNALERROR and reported no failing laws."""
    if task is not None:
        driver.run.dead_tasks.append(task)


def _bury(run: _Run) -> None:
    """Mark as seen the failures of the tasks the run's killed attempts ended (all done once the run is reaped).

    Not a done callback: those run on the loop's next turn, and the loop stops as soon as the run returns."""
    for task in run.dead_tasks:
        if task.done():
            _retrieve(task)
    run.dead_tasks.clear()


def _loop() -> VirtualTimeLoop:
    loop = asyncio.get_running_loop()
    if not isinstance(loop, VirtualTimeLoop):
        raise SimUsageError(f"the simulator runs on its VirtualTimeLoop, not on {type(loop).__name__}")
    return loop


def _freeze(value: Any) -> bytes | _Unpicklable:
    """The durable record of a value, which no later mutation of the original can reach (pickle is ~5x deepcopy)."""
    try:
        return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, AttributeError, TypeError):
        return _Unpicklable(value)


def _thaw(record: bytes | _Unpicklable) -> Any:
    return copy.deepcopy(record.value) if isinstance(record, _Unpicklable) else pickle.loads(record)


def _copy(value: T) -> T:
    return _thaw(_freeze(value))


_DIGESTS: dict[bytes, str] = {}


def _inputs_digest(task: str, inputs: dict[str, Any]) -> tuple[str, bytes | _Unpicklable]:
    """`content_digest(task, inputs)`, memoised process-wide by the inputs' pickle; and that frozen record of them.

    The canonical JSON digest was a fifth of a chaos scenario, and replays, reruns and same-seed scenarios ask it for
    the same inputs again and again. Equal pickles are equal values, so a hit returns the digest the canonical form
    would; equal values that pickle differently (another dict order) merely miss and compute it. The pickle is also
    the inputs' durable record, which each attempt thaws into its own copy.
    """
    record = _freeze(inputs)
    if isinstance(record, _Unpicklable):
        return content_digest(task, inputs), record
    key = hashlib.blake2b(task.encode() + b"\x00" + record, digest_size=16).digest()
    digest = _DIGESTS.get(key)
    if digest is None:
        if len(_DIGESTS) >= 1 << 16:
            _DIGESTS.clear()
        digest = _DIGESTS[key] = content_digest(task, inputs)
    return digest, record


@functools.lru_cache(maxsize=1 << 16)
def _action_id(scope: str, task: str, digest: str, occurrence: int) -> str:
    """An action's identity (recorded histories pin it: never change the formula)."""
    return content_digest(scope, task, digest, occurrence)[:16]


_SIGNATURES: dict[tuple[Callable[..., Any], bool], tuple[inspect.Signature, tuple[str, ...] | None]] = {}


def _signature(fn: Callable[..., Any]) -> tuple[inspect.Signature, tuple[str, ...] | None]:
    """`fn`'s signature, and its parameter names when all may be passed positionally (such calls skip `bind`).

    Every scenario wraps fresh tier objects, so the same few methods' signatures were computed again per scenario:
    they are kept by function, bound or not (a bound method's signature lacks its first parameter).
    """
    func = getattr(fn, "__func__", fn)
    key = (func, func is not fn)
    found = _SIGNATURES.get(key)
    if found is None:
        if len(_SIGNATURES) >= 1024:
            _SIGNATURES.clear()
        signature = inspect.signature(fn)
        plain = all(p.kind is p.POSITIONAL_OR_KEYWORD for p in signature.parameters.values())
        found = _SIGNATURES[key] = (signature, tuple(signature.parameters) if plain else None)
    return found


class SimTask:
    """A task of the simulator: `await task(*args)` inside a simulated run issues one durable action."""

    def __init__(
        self,
        sim: DurableSimulator,
        fn: Callable[..., Awaitable[Any]],
        *,
        name: str,
        retries: int,
        cache: bool,
        timeout_s: float | None,
    ) -> None:
        if retries < 0:
            raise ValueError(f"retries must be >= 0, got {retries}")
        if timeout_s is not None and timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        self.sim, self.fn, self.name = sim, fn, name
        self.retries, self.cache, self.timeout_s = retries, cache, timeout_s
        self._signature, self._positional = _signature(fn)
        """`_positional`: parameter names, when every parameter may be passed positionally: such calls skip `bind`."""
        functools.update_wrapper(self, fn)

    async def __call__(self, *args: Any, **kwargs: Any) -> Any:
        driver = _DRIVER.get()
        if driver is None:
            raise SimUsageError(f"task {self.name} was called outside DurableSimulator.run(); start a run first")
        sim, run = self.sim, driver.run
        if not kwargs and self._positional is not None and len(args) == len(self._positional):
            inputs = dict(zip(self._positional, args, strict=True))
        else:
            bound = self._signature.bind(*args, **kwargs)
            bound.apply_defaults()
            inputs = dict(bound.arguments)
        digest, frozen_inputs = _inputs_digest(self.name, inputs)
        scope = _TASK.get().action_id if _TASK.get() is not None else "driver"  # type: ignore[union-attr]
        occurrence = driver.occurrences[(self.name, digest)]
        driver.occurrences[(self.name, digest)] += 1
        action_id = _action_id(scope, self.name, digest, occurrence)
        issued = ActionRecord(action_id, self.name)

        sim._await_point(driver, f"call {self.name}")
        if run.strict_history is not None and action_id not in run.journal:
            index = len(driver.issued)
            expected = run.strict_history[index] if index < len(run.strict_history) else None
            sim._diverge(driver, ReplayDivergence(index, self.name, action_id, expected))
        driver.issued.append(issued)

        if action_id in run.failures:
            sim._log(driver, "action.replayed", self.name, action_id, "failed")
            raise run.failures[action_id]
        if action_id in run.journal:
            sim._log(driver, "action.replayed", self.name, action_id)
            record = run.journal[action_id]
        elif run.recover_from is not None and action_id in run.recover_from:
            sim._log(driver, "action.recovered", self.name, action_id)
            record = run.journal[action_id] = run.recover_from[action_id]
        elif self.cache and (self.name, digest) in sim._cache:
            sim._log(driver, "action.cached", self.name, action_id)
            record = run.journal[action_id] = sim._cache[(self.name, digest)]
        else:
            execution = run.inflight.get(action_id)
            if execution is not None:
                # Remotely the retried driver re-submits the same action name, finds it running, and monitors it.
                sim._log(driver, "action.attached", self.name, action_id)
            else:
                execution = run.loop.create_task(self._run_action(driver, action_id, digest, frozen_inputs))
                execution.add_done_callback(_retrieve)
                run.inflight[action_id] = execution
            # The action outlives a dead driver: cancelling this caller must not cancel the action.
            record = await asyncio.shield(execution)
        sim._await_point(driver, f"return {self.name}")
        return _thaw(record)

    async def _run_action(
        self, driver: _DriverAttempt, action_id: str, digest: str, inputs: bytes | _Unpicklable
    ) -> Any:
        """One action's execution, independent of the driver attempt that launched it; records its outcome."""
        sim, run = self.sim, driver.run
        try:
            output = await self._execute(driver, action_id, inputs)
        except TaskFailed as failure:
            run.failures[action_id] = failure
            raise
        finally:
            run.inflight.pop(action_id, None)
        record = run.journal[action_id] = _freeze(output)
        if self.cache:
            sim._cache[(self.name, digest)] = record
        sim._log(driver, "action.completed", self.name, action_id)
        return record

    async def _execute(self, driver: _DriverAttempt, action_id: str, inputs: bytes | _Unpicklable) -> Any:
        sim = self.sim
        last: BaseException | None = None
        for attempt in range(self.retries + 1):
            sim._log(driver, "action.start", self.name, action_id, f"attempt={attempt}")
            fault = sim.faults.task_fault(self.name, action_id, attempt, self.retries)
            if fault == "hang" and self.timeout_s is None:
                fault = None
            if fault is not None:
                sim.fired[_FAULT_KIND[fault]] += 1
                sim._log(driver, "fault.task", self.name, action_id, f"attempt={attempt} {fault}")
            token = _TASK.set(_TaskAttempt(action_id, attempt))
            try:
                if self.timeout_s is None:  # no deadline to arm: skip the context manager (~3% of a scenario)
                    return await self._body(inputs, fault)
                # asyncio.timeout, unlike wait_for, runs the body in this task: one task fewer per action.
                async with asyncio.timeout(self.timeout_s):
                    return await self._body(inputs, fault)
            except TimeoutError as exc:
                last = exc
                sim._log(driver, "action.timeout", self.name, action_id, f"attempt={attempt} after={self.timeout_s}s")
            except Exception as exc:
                last = exc
                sim._log(driver, "action.failed", self.name, action_id, f"attempt={attempt} {type(exc).__name__}")
            finally:
                _TASK.reset(token)
            if attempt < self.retries:
                sim._log(driver, "action.retry", self.name, action_id, f"attempt={attempt + 1}")
        assert last is not None
        raise TaskFailed(self.name, action_id, self.retries + 1, last) from last

    async def _body(self, inputs: bytes | _Unpicklable, fault: str | None) -> Any:
        if fault == "exhaust":
            raise InjectedTaskFailure(f"injected outage: {self.name} cannot run on any attempt (exhausts its retries)")
        if fault == "before":
            raise InjectedTaskFailure(f"injected failure before {self.name} ran")
        if fault == "hang":
            assert self.timeout_s is not None
            await asyncio.sleep(self.timeout_s * 2)
        output = await self.fn(**_thaw(inputs))  # each attempt gets its own copy of the recorded inputs
        if fault == "after":
            raise InjectedTaskFailure(f"injected failure after {self.name} ran, before its result was recorded")
        return output


class _Tier:
    """A protocol object whose chosen methods are tasks named `<tier>.<method>`; other attributes pass through."""

    def __init__(self, sim: DurableSimulator, obj: Any, name: str, methods: dict[str, dict[str, Any]]) -> None:
        self._obj = obj
        for method, options in methods.items():
            setattr(self, method, sim.task(getattr(obj, method), name=f"{name}.{method}", **options))

    def __getattr__(self, item: str) -> Any:
        return getattr(self._obj, item)


class SimCheckpointStore:
    """The driver's checkpoint (the `flyte.ctx().checkpoint` role): belongs to one run's driver attempts.

    Loads and saves are driver await points. With `atomic=True` (Flyte's behaviour: the blob is uploaded, then
    committed) a torn write leaves the previous checkpoint; with `atomic=False` it leaves the first half of the bytes.
    """

    def __init__(self, sim: DurableSimulator) -> None:
        self._sim = sim

    async def load(self) -> bytes | None:
        driver = self._sim._require_driver("checkpoint.load")
        self._sim._await_point(driver, "checkpoint.load")
        data = driver.run.checkpoint
        self._sim._log(driver, "checkpoint.load", detail="empty" if data is None else f"{len(data)}B")
        return data

    async def save(self, data: bytes) -> None:
        sim = self._sim
        driver = sim._require_driver("checkpoint.save")
        sim._await_point(driver, "checkpoint.save")
        may_crash = driver.run.crashes < sim.faults.max_driver_crashes
        if may_crash and sim.faults.tear_checkpoint(driver.number, driver.points):
            if not sim.atomic_checkpoints:
                driver.run.checkpoint = bytes(data[: len(data) // 2])
            sim.fired["torn_checkpoint"] += 1
            sim._log(driver, "checkpoint.torn", detail=f"{len(data)}B atomic={sim.atomic_checkpoints}")
            sim._crash(driver, "killed in the middle of a checkpoint write")
        driver.run.checkpoint = bytes(data)
        sim._log(driver, "checkpoint.save", detail=f"{len(data)}B")


class DurableSimulator:
    """Runs async driver code under simulated Flyte durable semantics. One `seed` fixes every fault and interleaving."""

    def __init__(
        self,
        seed: int = 0,
        faults: FaultPlan | None = None,
        *,
        atomic_checkpoints: bool = True,
        tie_break_seed: int | None = None,
    ) -> None:
        self.seed = seed
        self.faults = faults if faults is not None else FaultPlan(seed=seed)
        self.atomic_checkpoints = atomic_checkpoints
        self.tie_break_seed = tie_break_seed
        """None: ready tasks run first-in first-out; an int: each run's ties are shuffled by a seed derived from it."""
        self.fired: Counter[str] = Counter()
        """Faults that fired, by kind (task_failure, task_hang, exhausted_task, driver_crash, torn_checkpoint)."""
        self.events: list[Event] = []
        self._cache: dict[tuple[str, str], Any] = {}
        self._runs = 0
        self._loop: VirtualTimeLoop | None = None
        self._journals: dict[str, dict[str, Any]] = {}

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
        return _Tier(self, obj, name, methods)

    def trace(self, fn: Callable[..., Awaitable[T]] | None = None, *, name: str | None = None) -> Any:
        """Record a call's result inside a task attempt; a retry of that task replays it instead of calling again."""

        def wrap(f: Callable[..., Awaitable[T]]) -> Callable[..., Awaitable[T]]:
            trace_name = name or f.__qualname__
            signature = _signature(f)[0]

            @functools.wraps(f)
            async def traced(*args: Any, **kwargs: Any) -> T:
                driver = self._require_driver(f"trace {trace_name}")
                task = _TASK.get()
                bound = signature.bind(*args, **kwargs)
                bound.apply_defaults()
                digest = _inputs_digest(trace_name, dict(bound.arguments))[0]  # content_digest, memoised
                counter = task.trace_occurrences if task is not None else driver.occurrences
                occurrence = counter[(trace_name, digest)]
                counter[(trace_name, digest)] += 1
                key = (task.action_id if task is not None else "driver", trace_name, digest, occurrence)
                if key in driver.run.traces:
                    self._log(driver, "trace.replayed", trace_name, key[0])
                    return _thaw(driver.run.traces[key])
                result = await f(*args, **kwargs)
                driver.run.traces[key] = _freeze(result)
                self._log(driver, "trace.recorded", trace_name, key[0])
                return result

            return traced

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
        journal = self._journals[previous.run_id] if recover else None
        return self._start(driver, inputs, retries=retries, crash_at=None, recover_from=journal)

    def check_replay(self, recorded: RunResult, driver: Callable[..., Awaitable[Any]]) -> ReplayReport:
        """Run `driver` against `recorded`'s history without executing any task; report the first divergent action."""
        journal = self._journals[recorded.run_id]
        result = self._start(
            driver, dict(recorded.inputs), retries=0, crash_at=None, preload=dict(journal), strict=recorded.history
        )
        if isinstance(result.error, ReplayDivergence):
            return ReplayReport(ok=False, matched=result.error.index, divergence=result.error)
        if result.error is not None:
            raise result.error
        return ReplayReport(ok=True, matched=len(result.history))

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
        loop = VirtualTimeLoop(ties)
        run = _Run(f"run-{self._runs:04d}", driver, inputs, loop, recover_from=recover_from, strict_history=strict)
        if preload is not None:
            run.journal.update(preload)
        self._journals[run.run_id] = run.journal
        schedule = [crash_at] if isinstance(crash_at, int) else list(crash_at or [])
        self._loop = loop
        try:
            return loop.run_until_complete(self._supervise(run, retries, schedule))
        finally:
            self._loop = None
            loop.close()

    async def _supervise(self, run: _Run, retries: int, schedule: list[int]) -> RunResult:
        me = asyncio.current_task()
        error: BaseException | None = None
        output: Any = None
        attempt = _DriverAttempt(run, 0, None)
        for number in range(retries + 1):
            attempt = _DriverAttempt(run, number, schedule[number] if number < len(schedule) else None, supervisor=me)
            self._log(attempt, "driver.start")
            token = _DRIVER.set(attempt)
            main = asyncio.ensure_future(run.driver(**_copy(run.inputs)))
            _DRIVER.reset(token)
            try:
                output = await main
                error = None
            except BaseException as exc:
                error = exc
            await self._reap(me, spare=set(run.inflight.values()))
            killer = attempt.killer
            if killer is not None and killer.done() and not killer.cancelled():
                killer.exception()  # retrieved here, so asyncio doesn't report it as lost
            if attempt.divergence is not None:
                error = attempt.divergence
            if error is None:
                self._log(attempt, "driver.done")
                break
            if isinstance(error, ReplayDivergence):
                self._log(attempt, "replay.diverged", error.task, error.action_id, f"index={error.index}")
                break
            if attempt.crashed or isinstance(error, DriverCrash | asyncio.CancelledError):
                error = error if isinstance(error, DriverCrash) else DriverCrash("driver attempt killed")
                if number == retries:
                    error = DriverAttemptsExhausted(retries + 1, error)
                    self.fired["exhausted_driver"] += 1
                    self._log(attempt, "driver.exhausted", detail=f"attempts={retries + 1}")
            else:
                self._log(attempt, "driver.failed", detail=f"{type(error).__name__}: {error}")
        for action_id in list(run.inflight):
            self._log(attempt, "action.aborted", detail=f"{action_id}: the run ended while it ran")
        await self._reap(me)  # the run is over: its orphaned actions are aborted with it
        _bury(run)
        return RunResult(
            run_id=run.run_id,
            inputs=_copy(run.inputs),
            output=output,
            error=error,
            attempts=attempt.number + 1,
            crashes=run.crashes,
            await_points=attempt.points,
            history=tuple(attempt.issued),
            virtual_time_s=run.loop.time(),
        )

    @staticmethod
    async def _reap(supervisor: asyncio.Task[Any] | None, spare: Collection[asyncio.Future[Any]] = ()) -> None:
        """Cancel the driver code a dead (or finished) attempt left running, and wait for it to unwind.

        Actions in `spare` keep running: remotely they are their own executions, which a driver's death doesn't stop.
        """
        leftovers = [t for t in _loop_tasks() if t is not supervisor and t not in spare and not t.done()]
        for t in leftovers:
            t.cancel()
        if leftovers:
            await asyncio.gather(*leftovers, return_exceptions=True)

    # -- crash points and the log ----------------------------------------------------------------------------------
    def _require_driver(self, what: str) -> _DriverAttempt:
        driver = _DRIVER.get()
        if driver is None:
            raise SimUsageError(f"{what} was used outside DurableSimulator.run(); start a run first")
        return driver

    def _await_point(self, driver: _DriverAttempt, label: str) -> None:
        if driver.crashed:
            _dies_with_the_attempt(driver, asyncio.current_task())
            raise DriverCrash(f"driver attempt {driver.number} is dead")
        index = driver.points
        driver.points += 1
        if driver.crash_at == index:
            self._crash(driver, f"at await point {index} ({label})")
        if driver.run.crashes < self.faults.max_driver_crashes and self.faults.crash_driver(driver.number, index):
            self.fired["driver_crash"] += 1
            self._crash(driver, f"injected at await point {index} ({label})")

    def _crash(self, driver: _DriverAttempt, why: str) -> None:
        driver.run.crashes += 1
        self._log(driver, "driver.crash", detail=why)
        self._kill(driver, DriverCrash(f"driver attempt {driver.number} killed {why}"))

    def _diverge(self, driver: _DriverAttempt, divergence: ReplayDivergence) -> None:
        driver.divergence = divergence
        self._kill(driver, divergence)

    @staticmethod
    def _kill(driver: _DriverAttempt, exc: BaseException) -> None:
        """Stop the attempt everywhere at once: nothing it still runs may record a result."""
        driver.crashed = True
        current = driver.killer = asyncio.current_task()
        actions = set(driver.run.inflight.values()) if not isinstance(exc, ReplayDivergence) else set()
        for t in _loop_tasks():
            if t is not driver.supervisor and t is not current and t not in actions:
                _dies_with_the_attempt(driver, t)
                t.cancel()
        raise exc

    def _log(self, driver: _DriverAttempt, kind: str, task: str = "", action: str = "", detail: str = "") -> None:
        self.events.append(Event(driver.run.loop.time(), driver.run.run_id, driver.number, kind, task, action, detail))

    def log_lines(self) -> list[str]:
        return [e.line() for e in self.events]

    def count(self, kind: str, task: str | None = None, run: str | None = None) -> int:
        """How many events of `kind` (optionally for one task and one run) the log holds."""
        return sum(1 for e in self.events if e.kind == kind and task in (None, e.task) and run in (None, e.run))
