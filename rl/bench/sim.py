"""Benchmarks of the simulator and the GRPO loop on in-memory tiers; `rl bench` prints them side by side."""

from __future__ import annotations

import itertools
import statistics
import time
from dataclasses import replace
from typing import Any

from rl.bench.figures import check_repeats, spread
from rl.deploy.simulated.chaos import CHAOS_GRPO, grpo_random
from rl.deploy.simulated.chaos_agentic import agentic_report
from rl.deploy.simulated.grpo_sim import Latencies, grpo_sim, outcome_violations
from rl.deploy.simulated.grpo_tiers import LatencyModel
from rl.durable.durable_sim import DurableSimulator
from rl.loop.grpo import GrpoConfig

# The training-loop tutorial's measured loop: 434 s per iteration sequential, 298 s pipelined (Qwen3-8B, two nodes of
# four GPUs). Pipelining hides the trainer, so generation is ~298 s and the train step (cold start included) ~434 - 298
# s.
SEED_GENERATE_S = 298.0
SEED_TRAIN_S = 434.0 - 298.0


def replay_speed(actions: int = 2000) -> dict[str, float]:
    """Replay a recorded run of `actions` sequential actions without executing any of them."""
    sim = DurableSimulator(seed=0)

    @sim.task
    async def step(i: int, payload: list[float]) -> float:
        return sum(payload) + i

    async def driver() -> float:
        total = 0.0
        for i in range(actions):
            total += await step(i, [0.25] * 16)
        return total

    recorded = sim.run(driver)
    start = time.perf_counter()
    report = sim.check_replay(recorded, driver)
    elapsed = time.perf_counter() - start
    assert report.ok and report.matched == actions
    return {"replay_ms_per_action": 1000 * elapsed / actions, "replayed_actions_per_s": actions / elapsed}


def scenario_speed(scenarios: int = 100, repeats: int = 1) -> dict[str, Any]:
    """Swarm fault scenarios of the GRPO and agentic loops on in-memory tiers, every invariant checked, in this one
    process: `repeats` timed passes of `scenarios` new seeds each, as the median rate and its spread (`_min`, `_max`).

    Each loop first runs `scenarios` other seeds, which warms what a long `rl chaos` run has warmed: GRPO's
    uninterrupted references (one per run seed, 32 in all) and the caches. An agentic reference depends on the
    scenario's shape and dead trials as well, so nearly every timed agentic seed computes its own (98 distinct among
    seeds 100-199; 2,733 among the first 5,000), as most seeds of a long run do: the agentic rate includes them. Each
    pass takes seeds no earlier pass ran, so repeating does not warm them either.
    """
    check_repeats(repeats)
    figures: dict[str, Any] = {}
    failures = 0
    for key, check in (("scenarios_per_s", grpo_random(pipelined=False)), ("agentic_scenarios_per_s", agentic_report)):
        for seed in range(scenarios):
            check(seed)
        rates = []
        for n in range(1, repeats + 1):
            start = time.perf_counter()
            failures += sum(not check(seed).ok for seed in range(n * scenarios, (n + 1) * scenarios))
            rates.append(scenarios / (time.perf_counter() - start))
        figures.update(spread(key, rates))
    return {**figures, "scenario_failures": failures, "scenario_repeats": repeats}


def simulator_floor(runs: int = 32, repeats: int = 1) -> dict[str, float]:
    """What the simulator costs over the code it runs: an uninterrupted run of the chaos scenarios' GRPO shape
    (`CHAOS_GRPO`, run seeds 0..`runs`-1) on the simulator, and the same runs with the driver calling the same in-memory
    tiers directly (`grpo_sim(tasks=False)`: no records, copies, journal or faults), timed alternately `repeats` times.

    The direct run is a floor no speed-up of the simulator can pass: a chaos scenario is at least one such run (about
    1.45 on average, with its faults' retries, crashes and replays), so `1000 / grpo_direct_run_ms / 1.45` bounds the
    GRPO scenario rate on this machine. Both must finish with the same outcome, or nothing is printed.
    """
    check_repeats(repeats)
    configs = [(replace(CHAOS_GRPO, seed=seed), seed) for seed in range(runs)]
    for config, seed in configs:  # warms the in-memory tiers' process-wide memos for both, and checks they agree
        simulated, direct = (grpo_sim(config, seed=seed, tasks=tasks).run() for tasks in (True, False))
        if not (simulated.ok and direct.ok) or outcome_violations(simulated.output, direct.output):
            raise RuntimeError(f"run seed {seed}: the direct run's outcome differs from the simulated run's")
    simulated_ms: list[float] = []
    direct_ms: list[float] = []
    for _ in range(repeats):
        for tasks, times in ((True, simulated_ms), (False, direct_ms)):
            start = time.perf_counter()
            for config, seed in configs:
                grpo_sim(config, seed=seed, tasks=tasks).run()
            times.append(1000 * (time.perf_counter() - start) / runs)
    shares = [d / s for d, s in zip(direct_ms, simulated_ms, strict=True)]
    return {
        "grpo_run_ms": statistics.median(simulated_ms),
        "grpo_direct_run_ms": statistics.median(direct_ms),
        "grpo_direct_share": statistics.median(shares),
    }


def parallel_scenario_speed(scenarios: int = 400, jobs: int | None = None) -> dict[str, float]:
    """`rl chaos --jobs N`'s rate: the same swarm scenarios, every invariant checked, on `jobs` processes (default:
    every core). Each process warms its own references on a first pass of `scenarios` seeds; the second pass is timed.
    """
    import functools
    import os

    from rl.deploy.simulated.scenarios import scenario_in_worker, scenario_pool

    jobs = jobs or os.cpu_count() or 1
    rates: dict[str, float] = {}
    failures = 0
    with scenario_pool(jobs) as pool:
        for loop, key in (("grpo", "scenarios_per_s"), ("agentic", "agentic_scenarios_per_s")):
            run = functools.partial(scenario_in_worker, loop)
            pool.map(run, range(scenarios), chunksize=8)
            start = time.perf_counter()
            failures += sum(not r.ok for r in pool.map(run, range(scenarios, 2 * scenarios), chunksize=8))
            rates[f"{key}_{jobs}_jobs"] = scenarios / (time.perf_counter() - start)
    return {**rates, "parallel_scenario_failures": failures}


def _steady_iteration_s(pipelined: bool, iterations: int = 8) -> float:
    latencies = Latencies(
        generate=LatencyModel(base_s=SEED_GENERATE_S),
        score=LatencyModel(),
        train=LatencyModel(base_s=SEED_TRAIN_S),
    )
    config = GrpoConfig(
        iterations=iterations, prompts_per_iteration=4, group_size=4, pipelined=pipelined, evaluate=False
    )
    setup = grpo_sim(config, seed=0, latencies=latencies)
    result = setup.run()
    assert result.ok, result.error
    done = [e.t for e in setup.sim.events if e.kind == "action.completed" and e.task == "train.train_step"]
    return statistics.median(b - a for a, b in itertools.pairwise(done[1:]))


def pipeline_overlap() -> dict[str, float]:
    """Steady-state iteration time on the virtual clock, with the training-loop tutorial's generation/training
    proportions."""
    sequential, pipelined = _steady_iteration_s(False), _steady_iteration_s(True)
    return {
        "sequential_iteration_s": sequential,
        "pipelined_iteration_s": pipelined,
        "pipelined_over_max_gen_train": pipelined / max(SEED_GENERATE_S, SEED_TRAIN_S),
        "pipelined_over_sequential": pipelined / sequential,
        "seed_pipelined_over_sequential": 298.0 / 434.0,
    }


def simulator_bench(repeats: int = 1) -> dict[str, Any]:
    """`repeats`: timed passes of the one-process scenario rates (the other figures are measured once)."""
    return {
        **replay_speed(),
        **scenario_speed(repeats=repeats),
        **simulator_floor(repeats=repeats),
        **parallel_scenario_speed(),
        **pipeline_overlap(),
    }
