"""A simulated run and its driver and task attempts, and which of them the running code belongs to
(`attempt_number`, `run_name`: what `FLYTE_ATTEMPT_NUMBER` and `flyte.ctx()` say remotely)."""

from __future__ import annotations

import asyncio
import functools
from collections import defaultdict
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rl.durable.records import ActionRecord
from rl.durable.virtual_loop import VirtualTimeLoop

if TYPE_CHECKING:
    from rl.durable.replay import ReplayDivergence
    from rl.errors import TaskFailed


@dataclass
class Run:
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
    """Tasks a killed attempt ended (`dies_with_the_attempt`)."""


@dataclass
class DriverAttempt:
    run: Run
    number: int
    crash_at: int | None
    points: int = 0
    crashed: bool = False
    occurrences: defaultdict[tuple[str, str], int] = field(default_factory=functools.partial(defaultdict, int))
    """How often each (task, inputs digest) was called so far: a defaultdict, made in C (`Counter()` runs Python)."""
    issued: list[ActionRecord] = field(default_factory=list)
    supervisor: asyncio.Task[Any] | None = None
    divergence: ReplayDivergence | None = None
    killer: asyncio.Task[Any] | None = None


@dataclass
class TaskAttempt:
    action_id: str
    attempt: int
    trace_occurrences: defaultdict[tuple[str, str], int] = field(default_factory=functools.partial(defaultdict, int))


CURRENT_DRIVER: ContextVar[DriverAttempt | None] = ContextVar("rl_sim_driver", default=None)
CURRENT_TASK: ContextVar[TaskAttempt | None] = ContextVar("rl_sim_task", default=None)


def attempt_number() -> int:
    """The attempt number of the task this code runs in (0 for the first), as FLYTE_ATTEMPT_NUMBER is remotely.

    The driver is a task too: called from driver code (outside any child task) it is the driver's attempt number.
    """
    task = CURRENT_TASK.get()
    if task is not None:
        return task.attempt
    driver = CURRENT_DRIVER.get()
    return driver.number if driver is not None else 0


def run_name() -> str:
    """The id of the run this code runs in (`flyte.ctx().action.run_name` remotely); "" outside a run."""
    driver = CURRENT_DRIVER.get()
    return driver.run.run_id if driver is not None else ""
