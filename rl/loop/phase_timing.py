"""The seconds each phase of a GRPO iteration takes, measured in one place; the driver (`rl.loop.grpo`) calls these.

A row's `phase_s` (`rl.types.IterationMetrics`) holds `generate` (launch until the last group landed), `score` (the
scoring left after that), `train` (the step) and `evaluate` (the evaluation of the adapter the row trained, which runs
while the next iteration does, so it is added to the row when it lands). Every time is read from the event loop's clock:
virtual under the simulator, so no timing, and no test, depends on the machine running it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import NamedTuple, TypeVar

from rl.storage.checkpoint.format import DriverState
from rl.types import EvalResult, Rollout

T = TypeVar("T")


class Scored(NamedTuple):
    """One iteration's batch: its rollouts and rewards in canonical (group id) order, and the seconds its `generate`
    and `score` phases took."""

    rollouts: list[Rollout]
    rewards: list[float]
    phase_s: dict[str, float]


def now() -> float:
    """The event loop's clock."""
    return asyncio.get_running_loop().time()


async def timed(call: Callable[[], Awaitable[T]]) -> tuple[T, float]:
    """`await call()` and the seconds it took, counted from when the awaiting starts (for a launched task: when it first
    runs, not when it was launched)."""
    started = now()
    result = await call()
    return result, now() - started


def with_eval_time(state: DriverState, finished: tuple[EvalResult, float]) -> DriverState:
    """The state with the evaluation appended and its seconds noted on the row of the adapter it evaluated."""
    result, seconds = finished
    history = [
        replace(row, phase_s={**row.phase_s, "evaluate": seconds})
        if row.policy_version == result.policy_version
        else row
        for row in state.history
    ]
    return replace(state, history=history, evals=[*state.evals, result])
