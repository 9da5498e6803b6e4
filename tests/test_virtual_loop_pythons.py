"""The virtual loop on every supported Python: which iteration it runs, and one seed's trace in the same bytes."""

from __future__ import annotations

import asyncio
import hashlib
import sys
from asyncio import base_events

import pytest

from rl.deploy.simulated import grpo_tiers
from rl.deploy.simulated.chaos import grpo_random
from rl.deploy.simulated.chaos_agentic import agentic_report
from rl.durable import virtual_loop
from rl.durable.virtual_loop import VirtualTimeLoop, loop_path
from rl.errors import UnsupportedAsyncio
from rl.loop.awaiting import results_in_order

# sha256 prefixes of `rl chaos --loop L --seed S --trace`'s report lines, recorded on CPython 3.11.7; CI runs this file
# on 3.13 too (`nox -s unit-py313`), so a scheduling change between Pythons fails here.
TRACES = {
    ("grpo", 0): "403276784607d6f7",
    ("grpo", 1): "eadf177d71f2000a",
    ("grpo", 2): "2cde210293c86690",
    ("grpo", 3): "bd217a5b93cccc73",
    ("grpo", 52): "8763b53a731270c1",
    ("grpo-pipelined", 0): "be49bb639c265851",
    ("grpo-pipelined", 1): "e24608cd62621f38",
    ("grpo-pipelined", 2): "991c6498ce25ced9",
    ("grpo-pipelined", 3): "f64fc3d6630ce714",
    ("grpo-pipelined", 52): "18d6a8ae6f3fb6b6",
    ("agentic", 0): "e834301d2ff50b48",
    ("agentic", 1): "009c9bac4d8073a6",
    ("agentic", 2): "2179bab3a851d4dd",
    ("agentic", 3): "0afc5446915c875d",
    ("agentic", 52): "c78dc83554d6bc90",
}


def _trace(loop: str, seed: int, path: str = virtual_loop.LOOP_PATH) -> str:
    if loop == "agentic":
        lines = agentic_report(seed, trace=True, loop_path=path).trace
    else:
        lines = grpo_random(pipelined=loop == "grpo-pipelined", trace=True, loop_path=path)(seed).trace
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]


@pytest.mark.parametrize(("loop", "seed"), sorted(TRACES))
def test_a_seeds_trace_is_the_same_bytes_on_every_python(loop, seed):
    """One seed is one trace on 3.11 and 3.13: the interleaving, virtual times, digests and outcome."""
    assert _trace(loop, seed) == TRACES[loop, seed]


@pytest.mark.parametrize("loop", ["grpo", "grpo-pipelined"])
def test_a_seeds_trace_does_not_depend_on_what_ran_before_it_in_the_process(loop):
    """The GRPO tiers' process-wide memos (held-out evaluations) must not change the interleaving: a scenario that
    misses them, as the first in a process does, takes the same loop turns as one that hits them."""
    grpo_tiers._EVALUATIONS.clear()
    first = _trace(loop, 0)
    assert _trace(loop, 0) == first


@pytest.mark.parametrize("loop", ["grpo", "grpo-pipelined", "agentic"])
def test_asyncios_own_iteration_gives_the_copied_iterations_trace(loop):
    """On a Python whose `_run_once` was not checked, the loop runs asyncio's own: slower, the same trace."""
    copied = [_trace(loop, seed, "copied") for seed in range(3)]
    assert [_trace(loop, seed, "asyncio") for seed in range(3)] == copied


def test_the_pythons_ci_runs_take_the_copied_iteration():
    """3.11's and 3.13's `_run_once` are the ones the copy was checked against (so their fast path is what CI runs)."""
    if sys.version_info[:2] not in ((3, 11), (3, 13)):
        pytest.skip(f"Python {sys.version_info[:2]} is not one CI runs")
    assert virtual_loop.LOOP_PATH == "copied"


def test_an_iteration_that_no_longer_selects_and_pops_is_refused_in_one_line():
    def _run_once(self):  # a future asyncio that dispatches some other way
        self._dispatch_everything()

    reason = loop_path(_run_once)
    assert reason not in ("copied", "asyncio") and "\n" not in reason and "3.11-3.13" in reason
    with pytest.raises(UnsupportedAsyncio, match="cannot drive it"):
        VirtualTimeLoop(path=reason)


def test_an_unchecked_iteration_that_selects_and_pops_runs_as_asyncios_own():
    """A changed `_run_once` (here: its source unreadable) that still selects once and pops `_ready` is driven."""
    namespace: dict[str, object] = {}
    exec(  # compiled from a string: inspect cannot read its source, so no digest can match
        "def _run_once(self):\n    self._selector.select(0)\n    self._scheduled\n    self._ready.popleft()\n",
        namespace,
    )
    assert virtual_loop.run_once_digest(namespace["_run_once"]) is None
    assert loop_path(namespace["_run_once"]) == "asyncio"
    assert loop_path(base_events.BaseEventLoop._run_once) == virtual_loop.LOOP_PATH


def test_results_in_order_reads_finished_futures_and_raises_a_finished_failure_at_once():
    async def main() -> None:
        loop = asyncio.get_running_loop()
        done, late, failed = loop.create_future(), loop.create_future(), loop.create_future()
        done.set_result(1)
        loop.call_later(5, late.set_result, 2)
        assert await results_in_order([late, done]) == [2, 1]
        failed.set_exception(ValueError("scorer failed"))
        never = loop.create_future()  # would hang a gather that waited on it first
        with pytest.raises(ValueError, match="scorer failed"):
            await results_in_order([never, failed])

    loop = VirtualTimeLoop()
    try:
        loop.run_until_complete(main())
    finally:
        loop.close()
