"""The chaos scenario and kill sweep of each loop by name (`rl chaos --loop`, `rl bench`), and the function a worker
process runs for one scenario."""

from __future__ import annotations

import functools
import multiprocessing
import multiprocessing.pool
from collections.abc import Callable, Hashable, Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rl.deploy.simulated.chaos import ScenarioReport

LOOPS = ("grpo", "grpo-pipelined", "agentic")

Sweep = Callable[[], tuple[int, list[str]]]
"""A kill-at-every-await-point sweep: how many points it killed at, and each violation found."""


def scenario_and_sweep(loop: str, trace: bool) -> tuple[Callable[[int], ScenarioReport], Sweep]:
    """The seeded random scenario and the sweep of `loop`, one of `LOOPS`."""
    if loop not in LOOPS:
        raise ValueError(f"unknown loop {loop!r}: expected one of {', '.join(LOOPS)}")
    if loop == "agentic":
        from rl.deploy.simulated.chaos_agentic import agentic_report, agentic_sweep

        return (lambda seed: agentic_report(seed, trace=trace)), agentic_sweep
    from rl.deploy.simulated.chaos import grpo_random, grpo_sweep

    pipelined = loop == "grpo-pipelined"

    def sweep() -> tuple[int, list[str]]:
        reports = grpo_sweep(pipelined)
        return len(reports), [f"kill at await point {r.seed}: {v}" for r in reports for v in r.violations]

    return grpo_random(pipelined, trace=trace), sweep


WORKER_MODULES = ("__main__", "rl.deploy.simulated.chaos", "rl.deploy.simulated.chaos_agentic")
"""What a scenario process imports. "__main__": the server imports the caller's main script once (the `rl` script,
so `rl.cli`), and a worker forked from it does not re-run that script as spawn made it do."""


def scenario_pool(jobs: int) -> multiprocessing.pool.Pool:
    """A pool of `jobs` processes for scenarios.

    forkserver where the platform has it: its server is a fresh process (not a fork of this one, so it inherits no
    threads or pipes, a pytest-xdist worker's channel say), imports `WORKER_MODULES` once and forks every worker from
    itself, so a worker starts with the simulator imported. Under spawn each worker imported it anew (~0.5 s of CPU
    each), a fixed cost per process that a short `rl chaos --jobs N` run never earned back. spawn elsewhere.
    """
    if "forkserver" in multiprocessing.get_all_start_methods():
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(list(WORKER_MODULES))  # ignored if this process's server already runs
        return context.Pool(jobs)
    return multiprocessing.get_context("spawn").Pool(jobs)


@functools.cache
def _cached_scenario(loop: str) -> Callable[[int], ScenarioReport]:
    return scenario_and_sweep(loop, False)[0]


def scenario_in_worker(loop: str, seed: int) -> ScenarioReport:
    """One scenario in a pool process: each process caches its own uninterrupted references."""
    return _cached_scenario(loop)(seed)


def scenarios_in_worker(loop: str, seeds: list[int]) -> list[ScenarioReport]:
    """Several scenarios in a pool process, in order: a group of `grouped_by_reference`."""
    scenario = _cached_scenario(loop)
    return [scenario(seed) for seed in seeds]


def reference_key(loop: str, seed: int) -> Hashable:
    """What the uninterrupted reference run that scenario `seed` of `loop` is checked against depends on (the cache
    key each loop computes it under): equal keys, one reference."""
    if loop not in LOOPS:
        raise ValueError(f"unknown loop {loop!r}: expected one of {', '.join(LOOPS)}")
    if loop == "agentic":
        from rl.deploy.simulated.chaos_agentic import agentic_swarm, reference_key

        return reference_key(*agentic_swarm(seed))
    from rl.deploy.simulated.chaos import grpo_swarm

    return grpo_swarm(seed).run_seed


def grouped_by_reference(loop: str, seeds: Iterable[int]) -> list[list[int]]:
    """`seeds` in groups that share a reference run, largest first, each in seed order.

    A pool process computes each reference its scenarios need once (32 GRPO run seeds): handing out seeds in plain
    chunks made every process compute nearly all of them, so N processes repeated that fixed cost N times and
    `rl chaos --jobs 2` barely beat one process. Grouped, N processes compute each reference once between them.
    """
    groups: dict[Hashable, list[int]] = {}
    for seed in seeds:
        groups.setdefault(reference_key(loop, seed), []).append(seed)
    return sorted(groups.values(), key=len, reverse=True)  # the big groups first, so the tail stays short
