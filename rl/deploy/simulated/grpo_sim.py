"""The GRPO driver on the durable simulator with in-memory tiers, and the invariants every run of it must satisfy.

Tier options follow the tutorial: rollouts and rewards retry twice, the trainer once; latencies are virtual seconds
in the proportions of the training-loop tutorial's measured loop (generation dominates, the trainer has a cold start).
"""

from __future__ import annotations

from collections.abc import Coroutine
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from rl.deploy.simulated.artifacts import MemoryArtifacts
from rl.deploy.simulated.grpo_tiers import (
    LatencyModel,
    MemoryEngine,
    MemoryEvaluator,
    MemoryScorer,
    MemoryTrainer,
    RecordingReporter,
)
from rl.durable.durable_sim import DurableSimulator
from rl.durable.faults import FaultPlan
from rl.durable.records import RunResult
from rl.durable.virtual_loop import LOOP_PATH
from rl.loop.grpo import GrpoConfig, GrpoDriver, GrpoOutcome, GrpoTiers, run_grpo, sample_prompts
from rl.problems import DigitSuccessor, marked_answer_metrics

T = TypeVar("T")

GENERATE, SCORE, INIT, TRAIN, EVALUATE = (
    "rollout.generate",
    "reward.score_group",
    "train.init_adapter",
    "train.train_step",
    "eval.evaluate",
)
TASK_RETRIES = {GENERATE: 2, SCORE: 2, INIT: 1, TRAIN: 1, EVALUATE: 1}
"""The tiers' tasks and their retry budgets (the tutorial's options)."""


@dataclass(frozen=True)
class Latencies:
    """Virtual seconds per call. Defaults: a group takes ~30–60 s, a step ~20 s plus 0.5 s a sample."""

    generate: LatencyModel = field(default_factory=lambda: LatencyModel(base_s=30.0, per_item_s=1.0, jitter_s=30.0))
    score: LatencyModel = field(default_factory=lambda: LatencyModel(base_s=0.5, jitter_s=0.5))
    train: LatencyModel = field(default_factory=lambda: LatencyModel(base_s=20.0, per_item_s=0.5))
    evaluate: LatencyModel = field(default_factory=lambda: LatencyModel(base_s=10.0))
    train_cold_start_s: float = 0.0


@dataclass
class GrpoSim:
    """One simulated GRPO deployment: the simulator, the tiers as its tasks, and the raw in-memory tiers behind them."""

    sim: DurableSimulator
    config: GrpoConfig
    tiers: GrpoTiers
    artifacts: MemoryArtifacts
    trainer: MemoryTrainer
    reporter: RecordingReporter
    driver_fn: GrpoDriver = run_grpo

    async def driver(self) -> GrpoOutcome:
        return await self.driver_fn(self.config, self.tiers, self.sim.checkpoint_store())

    def run(self, *, retries: int = 0, crash_at: int | list[int] | None = None) -> RunResult:
        return self.sim.run(self.driver, retries=retries, crash_at=crash_at)


def grpo_sim(
    config: GrpoConfig,
    *,
    seed: int = 0,
    faults: FaultPlan | None = None,
    latencies: Latencies = Latencies(),
    driver: GrpoDriver = run_grpo,
    retries: dict[str, int] | None = None,
    tie_break_seed: int | None = None,
    tasks: bool = True,
    loop_path: str = LOOP_PATH,
) -> GrpoSim:
    """`retries` overrides tasks' retry budgets by name (`{"train.train_step": 0}`); `tie_break_seed` shuffles ties.

    `tasks=False` binds the in-memory tiers to the driver directly, not as simulator tasks: no records, copies, journal
    or task faults, only the driver's checkpoint and the virtual clock. `rl bench` times it as the floor under a
    simulated run.
    """
    budget = {**TASK_RETRIES, **(retries or {})}
    unknown = set(budget) - set(TASK_RETRIES)
    if unknown:
        raise ValueError(f"grpo_sim retries names unknown tasks {sorted(unknown)}; known: {sorted(TASK_RETRIES)}")
    sim = DurableSimulator(seed=seed, faults=faults, tie_break_seed=tie_break_seed, loop_path=loop_path)
    bind = sim.tier if tasks else _direct
    artifacts = MemoryArtifacts()
    prompts = DigitSuccessor()
    engine = MemoryEngine(artifacts, latency=latencies.generate)
    trainer = MemoryTrainer(
        artifacts,
        max_staleness=config.max_staleness,
        latency=latencies.train,
        cold_start_s=latencies.train_cold_start_s,
    )
    reporter = RecordingReporter()
    tiers = GrpoTiers(
        engine=bind(engine, "rollout", generate={"retries": budget[GENERATE], "timeout_s": 600.0}),
        scorer=bind(MemoryScorer(latency=latencies.score), "reward", score_group={"retries": budget[SCORE]}),
        trainer=bind(trainer, "train", init_adapter={"retries": budget[INIT]}, train_step={"retries": budget[TRAIN]}),
        artifacts=artifacts,
        prompts=prompts,
        evaluator=bind(
            MemoryEvaluator(artifacts, prompts.eval_prompts(), latency=latencies.evaluate),
            "eval",
            evaluate={"retries": budget[EVALUATE]},
        ),
        reporter=reporter,
        task_metrics=marked_answer_metrics,  # the in-memory engine answers "####<digit>"
    )
    return GrpoSim(sim, config, tiers, artifacts, trainer, reporter, driver)


def _direct(obj: T, name: str, **methods: dict[str, Any]) -> T:
    return obj


def lineage_violations(config: GrpoConfig, setup: GrpoSim, outcome: GrpoOutcome) -> list[str]:
    """Read the final adapter's lineage: versions 1..N once each, and every iteration's prompts trained exactly once."""
    from rl.deploy.simulated.grpo_tiers import decode_table

    files = _resolved(setup.artifacts.get(outcome.adapter))
    lineage: list[dict[str, Any]] = decode_table(files)["lineage"]
    problems: list[str] = []
    versions = [entry["version"] for entry in lineage]
    if versions != list(range(1, config.iterations + 1)):
        problems.append(f"adapter lineage has versions {versions}, expected 1..{config.iterations} each exactly once")
    train_prompts = setup.tiers.prompts.train_prompts()
    for it in range(config.iterations):
        steps = [e for e in lineage if e["step"] == it]
        if len(steps) != 1:
            problems.append(f"iteration {it} was trained {len(steps)} times")
            continue
        expected = sorted({p.question for p in sample_prompts(config, train_prompts, it)})
        if steps[0]["prompts"] != expected:
            problems.append(f"iteration {it} trained prompts {steps[0]['prompts']}, expected {expected}")
    return problems


def _resolved(coro: Coroutine[Any, Any, T]) -> T:
    """The result of a coroutine that never suspends (the memory store's `get`), without an event loop per call.

    `asyncio.run` made and closed a loop, self-pipe included, for every scenario's lineage check (~3% of one).
    """
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value
    coro.close()
    raise RuntimeError(
        "the artifact store's get suspended: lineage_violations reads a GrpoSim's in-memory store; "
        "build the setup with grpo_sim()"
    )


def outcome_violations(reference: GrpoOutcome, outcome: GrpoOutcome) -> list[str]:
    """Differences from the uninterrupted run: adapter, optimizer state, history and evals must match bitwise."""
    problems = []
    if outcome.adapter.digest != reference.adapter.digest:
        problems.append("final adapter differs from the uninterrupted run's")
    if outcome.optimizer_state.digest != reference.optimizer_state.digest:
        problems.append("final optimizer state differs from the uninterrupted run's")
    if replace(outcome, resumed_from=-1) != replace(reference, resumed_from=-1):
        if outcome.history != reference.history:
            rows = [r.iteration for r in outcome.history]
            problems.append(f"history differs from the uninterrupted run's (iterations {rows})")
        if outcome.evals != reference.evals:
            problems.append("held-out evaluations differ from the uninterrupted run's")
    return problems
