"""Supervising a simulated run: driver attempts run one after another until one finishes or the retries run out; an
attempt dies at an await point (a planned crash point or a seeded fault), everywhere at once, and its leftover code is
reaped while its actions in flight run on."""

from __future__ import annotations

import asyncio
from collections.abc import Collection
from typing import TYPE_CHECKING, Any

from rl.durable.attempts import CURRENT_DRIVER, DriverAttempt, Run
from rl.durable.frozen import copy_value
from rl.durable.records import RunResult
from rl.durable.replay import ReplayDivergence
from rl.durable.virtual_loop import VirtualTimeLoop
from rl.errors import DriverAttemptsExhausted, DriverCrash

if TYPE_CHECKING:
    from rl.durable.kernel import SimKernel


async def supervise(sim: SimKernel, run: Run, retries: int, schedule: list[int]) -> RunResult:
    me = asyncio.current_task()
    error: BaseException | None = None
    output: Any = None
    attempt = DriverAttempt(run, 0, None)
    for number in range(retries + 1):
        attempt = DriverAttempt(run, number, schedule[number] if number < len(schedule) else None, supervisor=me)
        sim.log(attempt, "driver.start")
        token = CURRENT_DRIVER.set(attempt)
        main = asyncio.ensure_future(run.driver(**copy_value(run.inputs)))
        CURRENT_DRIVER.reset(token)
        try:
            output = await main
            error = None
        except BaseException as exc:
            error = exc
        await reap(me, spare=set(run.inflight.values()))
        killer = attempt.killer
        if killer is not None and killer.done() and not killer.cancelled():
            killer.exception()  # retrieved here, so asyncio doesn't report it as lost
        if attempt.divergence is not None:
            error = attempt.divergence
        if error is None:
            sim.log(attempt, "driver.done")
            break
        if isinstance(error, ReplayDivergence):
            sim.log(attempt, "replay.diverged", error.task, error.action_id, f"index={error.index}")
            break
        if attempt.crashed or isinstance(error, DriverCrash | asyncio.CancelledError):
            error = error if isinstance(error, DriverCrash) else DriverCrash("driver attempt killed")
            if number == retries:
                error = DriverAttemptsExhausted(retries + 1, error)
                sim.fired["exhausted_driver"] += 1
                sim.log(attempt, "driver.exhausted", detail=f"attempts={retries + 1}")
        else:
            sim.log(attempt, "driver.failed", detail=f"{type(error).__name__}: {error}")
    for action_id in list(run.inflight):
        sim.log(attempt, "action.aborted", detail=f"{action_id}: the run ended while it ran")
    await reap(me)  # the run is over: its orphaned actions are aborted with it
    bury(run)
    return RunResult(
        run_id=run.run_id,
        inputs=copy_value(run.inputs),
        output=output,
        error=error,
        attempts=attempt.number + 1,
        crashes=run.crashes,
        await_points=attempt.points,
        history=tuple(attempt.issued),
        virtual_time_s=run.loop.time(),
    )


async def reap(supervisor: asyncio.Task[Any] | None, spare: Collection[asyncio.Future[Any]] = ()) -> None:
    """Cancel the driver code a dead (or finished) attempt left running, and wait for it to unwind.

    Actions in `spare` keep running: remotely they are their own executions, which a driver's death doesn't stop.
    """
    leftovers = [t for t in loop_tasks() if t is not supervisor and t not in spare and not t.done()]
    for t in leftovers:
        t.cancel()
    if leftovers:
        await asyncio.gather(*leftovers, return_exceptions=True)


def await_point(sim: SimKernel, driver: DriverAttempt, label: str) -> None:
    if driver.crashed:
        dies_with_the_attempt(driver, asyncio.current_task())
        raise DriverCrash(f"driver attempt {driver.number} is dead")
    index = driver.points
    driver.points += 1
    if driver.crash_at == index:
        crash(sim, driver, f"at await point {index} ({label})")
    faults = sim.faults
    if (
        faults.driver_crash_p
        and driver.run.crashes < faults.max_driver_crashes
        and faults.crash_driver(driver.number, index)
    ):
        sim.fired["driver_crash"] += 1
        crash(sim, driver, f"injected at await point {index} ({label})")


def crash(sim: SimKernel, driver: DriverAttempt, why: str) -> None:
    driver.run.crashes += 1
    sim.log(driver, "driver.crash", detail=why)
    kill(driver, DriverCrash(f"driver attempt {driver.number} killed {why}"))


def diverge(driver: DriverAttempt, divergence: ReplayDivergence) -> None:
    driver.divergence = divergence
    kill(driver, divergence)


def kill(driver: DriverAttempt, exc: BaseException) -> None:
    """Stop the attempt everywhere at once: nothing it still runs may record a result."""
    driver.crashed = True
    current = driver.killer = asyncio.current_task()
    actions = set(driver.run.inflight.values()) if not isinstance(exc, ReplayDivergence) else set()
    for t in loop_tasks():
        if t is not driver.supervisor and t is not current and t not in actions:
            dies_with_the_attempt(driver, t)
            t.cancel()
    raise exc


def loop_tasks() -> list[asyncio.Task[Any]]:
    """The running loop's unfinished tasks, in creation order on the virtual loop (so a kill's cancellations, and the
    event log after it, are the same on every run of a seed)."""
    loop = asyncio.get_running_loop()
    return loop.tasks_in_creation_order() if isinstance(loop, VirtualTimeLoop) else list(asyncio.all_tasks(loop))


def retrieve(execution: asyncio.Future[Any]) -> None:
    """Mark an action's failure as seen: an orphaned action may fail with nobody left awaiting it."""
    if not execution.cancelled():
        execution.exception()


def dies_with_the_attempt(driver: DriverAttempt, task: asyncio.Task[Any] | None) -> None:
    """Note a task the attempt's death ends: the run marks the failure it ends with as seen (`bury`).

    A killed attempt's code unwinds with whatever its awaits raise: a `finally` that calls a task gets "attempt is
    dead", and a task awaiting a gather that holds the killing task can end with its `DriverCrash`. Nothing awaits
    either any more. Remotely that code died with its process; here asyncio would report "Task exception was never
    retrieved" from the task's finalizer, whenever the garbage collector reaches it. On CPython 3.11.7 and 3.12.1 that
    report (a traceback, formatted with `ast.parse`) can land inside another `ast.parse`, pytest's, which then fails
    with "AST constructor recursion depth mismatch" (cpython gh-106905, fixed in 3.11.8 and 3.12.2): the conformance
    self-test's in-process suite run died of an INTERNALERROR and reported no failing laws."""
    if task is not None:
        driver.run.dead_tasks.append(task)


def bury(run: Run) -> None:
    """Mark as seen the failures of the tasks the run's killed attempts ended (all done once the run is reaped).

    Not a done callback: those run on the loop's next turn, and the loop stops as soon as the run returns."""
    for task in run.dead_tasks:
        if task.done():
            retrieve(task)
    run.dead_tasks.clear()
