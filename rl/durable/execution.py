"""Executing a task call on the simulator: each call is a durable action, replayed, recovered, served from the cache,
attached to while in flight, or run with retries, timeouts and seeded faults (`SimTask`); `Tier` makes a protocol
object's methods such tasks."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from rl.durable.attempts import CURRENT_DRIVER, CURRENT_TASK, DriverAttempt, TaskAttempt
from rl.durable.frozen import Record, action_identity, freeze, inputs_digest, signature_of, thaw
from rl.durable.records import new_action_record
from rl.durable.replay import ReplayDivergence
from rl.durable.supervisor import await_point, diverge, retrieve
from rl.errors import InjectedTaskFailure, SimUsageError, TaskFailed

if TYPE_CHECKING:
    from rl.durable.kernel import SimKernel

FAULT_KIND = {"before": "task_failure", "after": "task_failure", "hang": "task_hang", "exhaust": "exhausted_task"}
"""A task fault as `DurableSimulator.fired` counts it."""


class SimTask:
    """A task of the simulator: `await task(*args)` inside a simulated run issues one durable action."""

    def __init__(
        self,
        sim: SimKernel,
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
        self.signature_of, self._positional = signature_of(fn)
        """`_positional`: parameter names, when every parameter may be passed positionally: such calls skip `bind`."""
        self._labels = (f"call {name}", f"return {name}")  # await points' labels, formatted once
        functools.update_wrapper(self, fn)

    async def __call__(self, *args: Any, **kwargs: Any) -> Any:
        driver = CURRENT_DRIVER.get()
        if driver is None:
            raise SimUsageError(f"task {self.name} was called outside DurableSimulator.run(); start a run first")
        sim, run, name = self.sim, driver.run, self.name
        if not kwargs and self._positional is not None and len(args) == len(self._positional):
            inputs = dict(zip(self._positional, args, strict=True))
        else:
            bound = self.signature_of.bind(*args, **kwargs)
            bound.apply_defaults()
            inputs = dict(bound.arguments)
        digest, frozen_inputs = inputs_digest(name, inputs)
        task = CURRENT_TASK.get()
        key = (name, digest)
        occurrence = driver.occurrences[key]
        driver.occurrences[key] = occurrence + 1
        action_id = action_identity(task.action_id if task is not None else "driver", name, digest, occurrence)

        await_point(sim, driver, self._labels[0])
        if run.strict_history is not None and action_id not in run.journal:
            index = len(driver.issued)
            expected = run.strict_history[index] if index < len(run.strict_history) else None
            diverge(driver, ReplayDivergence(index, name, action_id, expected))
        driver.issued.append(new_action_record((action_id, name)))

        if action_id in run.failures:
            sim.log(driver, "action.replayed", self.name, action_id, "failed")
            raise run.failures[action_id]
        if action_id in run.journal:
            sim.log(driver, "action.replayed", self.name, action_id)
            record = run.journal[action_id]
        elif run.recover_from is not None and action_id in run.recover_from:
            sim.log(driver, "action.recovered", self.name, action_id)
            record = run.journal[action_id] = run.recover_from[action_id]
        elif self.cache and sim.has_cached(self.name, digest):
            sim.log(driver, "action.cached", self.name, action_id)
            record = run.journal[action_id] = sim.cached(self.name, digest)
        else:
            execution = run.inflight.get(action_id)
            if execution is not None:
                # Remotely the retried driver re-submits the same action name, finds it running, and monitors it.
                sim.log(driver, "action.attached", self.name, action_id)
            else:
                execution = run.loop.create_task(self._run_action(driver, action_id, digest, frozen_inputs))
                execution.add_done_callback(retrieve)
                run.inflight[action_id] = execution
            record = await _outlived(execution)
        await_point(sim, driver, self._labels[1])
        return thaw(record)

    async def _run_action(self, driver: DriverAttempt, action_id: str, digest: str, inputs: Record) -> Any:
        """One action's execution, independent of the driver attempt that launched it: its attempts, with retries,
        timeouts and seeded faults; then its outcome recorded."""
        sim, run, name, retries = self.sim, driver.run, self.name, self.retries
        last: BaseException | None = None
        try:
            for attempt in range(retries + 1):
                sim.log(driver, "action.start", name, action_id, f"attempt={attempt}")
                faults = sim.faults
                fault = faults.task_fault(name, action_id, attempt, retries) if faults.task_faults else None
                if fault == "hang" and self.timeout_s is None:
                    fault = None
                if fault is not None:
                    sim.fired[FAULT_KIND[fault]] += 1
                    sim.log(driver, "fault.task", name, action_id, f"attempt={attempt} {fault}")
                token = CURRENT_TASK.set(TaskAttempt(action_id, attempt))
                try:
                    if self.timeout_s is None:  # no deadline to arm: skip the context manager (~3% of a scenario)
                        output = await self._body(inputs, fault)
                    else:  # asyncio.timeout, unlike wait_for, runs the body in this task: one task fewer per action.
                        async with asyncio.timeout(self.timeout_s):
                            output = await self._body(inputs, fault)
                    break
                except TimeoutError as exc:
                    last = exc
                    sim.log(driver, "action.timeout", name, action_id, f"attempt={attempt} after={self.timeout_s}s")
                except Exception as exc:
                    last = exc
                    sim.log(driver, "action.failed", name, action_id, f"attempt={attempt} {type(exc).__name__}")
                finally:
                    CURRENT_TASK.reset(token)
                if attempt < retries:
                    sim.log(driver, "action.retry", name, action_id, f"attempt={attempt + 1}")
            else:
                assert last is not None
                raise TaskFailed(name, action_id, retries + 1, last) from last
        except TaskFailed as failure:
            run.failures[action_id] = failure
            raise
        finally:
            run.inflight.pop(action_id, None)
        record = run.journal[action_id] = freeze(output)
        if self.cache:
            sim.cache_result(name, digest, record)
        sim.log(driver, "action.completed", name, action_id)
        return record

    def _body(self, inputs: Record, fault: str | None) -> Awaitable[Any]:
        """An attempt's body: the task's own coroutine on its own copy of the recorded inputs, unless a fault fires."""
        return self.fn(**thaw(inputs)) if fault is None else self._faulted(inputs, fault)

    async def _faulted(self, inputs: Record, fault: str) -> Any:
        """An attempt's body under an injected fault."""
        if fault == "exhaust":
            raise InjectedTaskFailure(f"injected outage: {self.name} cannot run on any attempt (exhausts its retries)")
        if fault == "before":
            raise InjectedTaskFailure(f"injected failure before {self.name} ran")
        if fault == "hang":
            assert self.timeout_s is not None
            await asyncio.sleep(self.timeout_s * 2)
        output = await self.fn(**thaw(inputs))
        if fault == "after":
            raise InjectedTaskFailure(f"injected failure after {self.name} ran, before its result was recorded")
        return output


def _outlived(execution: asyncio.Future[Any]) -> asyncio.Future[Any]:
    """What the driver awaits for an action: `asyncio.shield(execution)`, so cancelling the driver (its death) cancels
    only its wait and the action runs on.

    asyncio's shield also gives its waiter a done callback, which runs a loop turn of its own after every action only
    to find the action finished; the action's outcome reaches the waiter here through one callback, and a cancelled
    waiter leaves the action's failure to `retrieve`.
    """
    if execution.done():
        return execution
    waiter = execution.get_loop().create_future()
    execution.add_done_callback(functools.partial(_relay, waiter))
    return waiter


def _relay(waiter: asyncio.Future[Any], execution: asyncio.Future[Any]) -> None:
    if waiter.done():  # the driver that waited died first
        return
    if execution.cancelled():
        waiter.cancel()
    elif (exc := execution.exception()) is not None:
        waiter.set_exception(exc)
    else:
        waiter.set_result(execution.result())


class Tier:
    """A protocol object whose chosen methods are tasks named `<tier>.<method>`; other attributes pass through."""

    def __init__(self, task: Callable[..., SimTask], obj: Any, name: str, methods: dict[str, dict[str, Any]]) -> None:
        """`task` is the simulator's `task` decorator: `task(fn, name=..., retries=...)` makes `fn` a task."""
        self._obj = obj
        for method, options in methods.items():
            setattr(self, method, task(getattr(obj, method), name=f"{name}.{method}", **options))

    def __getattr__(self, item: str) -> Any:
        return getattr(self._obj, item)
