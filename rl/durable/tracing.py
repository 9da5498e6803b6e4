"""`sim.trace` (`@flyte.trace`): a call inside a task attempt is recorded, and a retry of that task replays the
recorded result instead of calling again (the judge is billed once)."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from rl.durable.attempts import CURRENT_TASK
from rl.durable.frozen import freeze, inputs_digest, signature_of, thaw

if TYPE_CHECKING:
    from rl.durable.kernel import SimKernel

T = TypeVar("T")


def traced(sim: SimKernel, f: Callable[..., Awaitable[T]], trace_name: str) -> Callable[..., Awaitable[T]]:
    """`f` recorded per (calling task attempt, inputs, occurrence) in its run, replayed on that task's retries."""
    signature = signature_of(f)[0]

    @functools.wraps(f)
    async def traced(*args: Any, **kwargs: Any) -> T:
        driver = sim.require_driver(f"trace {trace_name}")
        task = CURRENT_TASK.get()
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        digest = inputs_digest(trace_name, dict(bound.arguments))[0]  # content_digest, memoised
        counter = task.trace_occurrences if task is not None else driver.occurrences
        occurrence = counter[(trace_name, digest)]
        counter[(trace_name, digest)] += 1
        key = (task.action_id if task is not None else "driver", trace_name, digest, occurrence)
        if key in driver.run.traces:
            sim.log(driver, "trace.replayed", trace_name, key[0])
            return thaw(driver.run.traces[key])
        result = await f(*args, **kwargs)
        driver.run.traces[key] = freeze(result)
        sim.log(driver, "trace.recorded", trace_name, key[0])
        return result

    return traced
