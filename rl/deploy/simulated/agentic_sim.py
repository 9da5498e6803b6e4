"""The agentic tutorial's agentic loop on the durable simulator: its tiers bound as simulator tasks, with the tutorial's
faults.

Bindings follow the tutorial's task options (`build_world` cached; `generate` and `train_step` retried once, with
300 s and 600 s timeouts; `verify_and_judge` retried twice, its judge call under `sim.trace`), on the virtual clock.
Fault model, each injector seeded: the tutorial's `AgenticFaults` (run inputs wrapping the tiers); `dead_trials`
(their sandboxes die on every attempt) and `dead_judgings` (their judging fails before the vendor is called), which
the driver must skip; and a `FaultPlan` (task failures, hung sandboxes, driver crashes). The trainer lives on a
run-scoped "cluster" (`RunScopedCluster`) that survives driver attempts; `BilledJudge` bills a call when its answer
arrives. Each binding, latency and injector in full: docs/agentic.md#on-the-simulator.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from rl.agentic.bandit import BanditTrainer, PolicyTrainer
from rl.agentic.faults import AgenticFaults, FlakyJudging, FlakyTrials, Judge, Sandbox, with_driver_crash
from rl.agentic.judge import judge_score
from rl.agentic.tiers import JudgeTier, SandboxTier, TrainerTier
from rl.deploy.simulated.worlds import MemoryWorlds
from rl.durable.attempts import attempt_number, run_name
from rl.durable.durable_sim import DurableSimulator
from rl.durable.faults import FaultPlan
from rl.durable.records import RunResult
from rl.durable.virtual_loop import LOOP_PATH
from rl.errors import JudgeOutage, SandboxFailure
from rl.loop.agentic import AgenticConfig, AgenticOutcome, run_agentic
from rl.protocols import AgenticTiers, WorldStore
from rl.types import Reward, Rubric, Trajectory, TrialSpec, Weights, WorldRef

GENERATE = "sandbox.generate"
BUILD_WORLD = "sandbox.build_world"
JUDGE = "judge.verify_and_judge"
JUDGE_CALL = "judge.call_judge"
SETUP = "trainer.setup_trainer"
TRAIN_STEP = "trainer.train_step"

TASK_RETRIES = {BUILD_WORLD: 0, GENERATE: 1, JUDGE: 2, SETUP: 0, TRAIN_STEP: 1}
"""Each task's retry budget: the tutorial's options."""

FIRST_TRAINER_PID = 4100
NO_FAULTS = AgenticFaults()

AgenticDriver = Callable[[AgenticConfig, AgenticTiers], Awaitable[AgenticOutcome]]
"""`async (config, tiers) -> AgenticOutcome`: `rl.loop.agentic.run_agentic`, or a fork's driver under conformance."""


class BilledJudge:
    """The vendor judge: answers `judge_score` after `latency_s`, and bills each answered call by (trial, rubric)."""

    def __init__(self, latency_s: float = 0.5) -> None:
        self.latency_s = latency_s
        self.started: Counter[tuple[str, str]] = Counter()
        self.billed: Counter[tuple[str, str]] = Counter()

    async def __call__(self, traj: Trajectory, rubric: Rubric) -> float:
        key = (traj.trial_id, rubric.name)
        self.started[key] += 1
        await asyncio.sleep(self.latency_s)
        self.billed[key] += 1
        return judge_score(traj, rubric)


TrainerFactory = Callable[[Sequence[str], int], PolicyTrainer]
"""`(world_ids, identity) -> PolicyTrainer`: how the cluster creates a run's trainer (a fork's, under conformance)."""

JudgeTierFactory = Callable[..., Any]
"""`(judge, trace) -> tier with verify_and_judge(traj, rubric)`: how the judge tier is built over the vendor judge."""


def bandit_trainer(world_ids: Sequence[str], identity: int) -> BanditTrainer:
    return BanditTrainer(world_ids, identity=identity)


def traced_judge_tier(
    judge: Callable[[Trajectory, Rubric], Awaitable[float]],
    trace: Callable[
        [Callable[[Trajectory, Rubric], Awaitable[float]]], Callable[[Trajectory, Rubric], Awaitable[float]]
    ],
) -> JudgeTier:
    """The agentic tutorial's judge tier: the vendor call under the durable `trace`, so a task retry replays it
    unbilled."""
    return JudgeTier(trace(judge))


class RunScopedCluster:
    """Trainers by run name: one per run, created on first attach, alive across that run's driver attempts."""

    def __init__(self, first_pid: int = FIRST_TRAINER_PID, factory: TrainerFactory = bandit_trainer) -> None:
        self.trainers: dict[str, PolicyTrainer] = {}
        self._next_pid = first_pid
        self._factory = factory

    def attach(self, world_ids: Sequence[str]) -> PolicyTrainer:
        key = run_name()
        trainer = self.trainers.get(key)
        if trainer is None:
            trainer = self.trainers[key] = self._factory(list(world_ids), self._next_pid)
            self._next_pid += 1
        check = getattr(trainer, "check_world_ids", None)
        if check is not None:
            check(world_ids)
        return trainer


class DeadAndSlowTrials:
    """A sandbox tier whose `dead_trials` fail on every attempt (a poisoned sandbox image, say) and whose trials land
    after `trial_delay_s(trial_id)` (a slow sandbox: reorders when trials land); otherwise `inner`'s."""

    def __init__(
        self,
        inner: Sandbox,
        *,
        dead_trials: frozenset[str] = frozenset(),
        tool_latency_s: float = 0.2,
        trial_delay_s: Callable[[str], float] | None = None,
    ) -> None:
        self.inner, self.dead_trials = inner, dead_trials
        self.tool_latency_s, self.trial_delay_s = tool_latency_s, trial_delay_s

    async def build_world(self, world_id: str, seed: int) -> WorldRef:
        return await self.inner.build_world(world_id, seed)

    async def generate(self, spec: TrialSpec, weights: Weights, world: WorldRef) -> Trajectory:
        if self.trial_delay_s is not None:
            await asyncio.sleep(self.trial_delay_s(spec.trial_id))
        if spec.trial_id in self.dead_trials:
            await asyncio.sleep(self.tool_latency_s)
            raise SandboxFailure(f"sandbox for {spec.trial_id} died on attempt {attempt_number()} (a dead trial)")
        return await self.inner.generate(spec, weights, world)


class DeadJudgings:
    """A judge tier whose judging of `dead` trials fails on every attempt, before the vendor is called (nothing is
    billed); otherwise `inner`'s."""

    def __init__(self, inner: Judge, dead: frozenset[str]) -> None:
        self.inner, self.dead = inner, dead

    async def verify_and_judge(self, traj: Trajectory, rubric: Rubric) -> Reward:
        if traj.trial_id in self.dead:
            raise JudgeOutage(f"judging {traj.trial_id} failed on attempt {attempt_number()} (a dead judging)")
        return await self.inner.verify_and_judge(traj, rubric)


class SimAgenticTiers:
    """The `rl.protocols.AgenticTiers` of one simulator run: each method a task with the tutorial's options.

    `sandbox` and `judge` come already wrapped in the run's faults: the actions' inputs are the production tasks'.
    """

    def __init__(
        self,
        sim: DurableSimulator,
        sandbox: Sandbox,
        judge: Judge,
        trainer: TrainerTier,
        retries: dict[str, int] | None = None,
    ) -> None:
        budget = {**TASK_RETRIES, **(retries or {})}
        unknown = set(budget) - set(TASK_RETRIES)
        if unknown:
            raise ValueError(f"retries names unknown tasks {sorted(unknown)}; known: {sorted(TASK_RETRIES)}")
        self.build_world = sim.task(sandbox.build_world, name=BUILD_WORLD, cache=True, retries=budget[BUILD_WORLD])
        self.generate = sim.task(sandbox.generate, name=GENERATE, retries=budget[GENERATE], timeout_s=300)
        self.verify_and_judge = sim.task(judge.verify_and_judge, name=JUDGE, retries=budget[JUDGE])
        self.setup_trainer = sim.task(trainer.setup_trainer, name=SETUP, retries=budget[SETUP])
        self.train_step = sim.task(trainer.train_step, name=TRAIN_STEP, retries=budget[TRAIN_STEP], timeout_s=600)

    @staticmethod
    def driver_attempt() -> int:
        return attempt_number()


def default_inputs(seed: int = 0) -> dict[str, Any]:
    """Every input of the driver, with the tutorial's defaults (3 steps x 3 prompts x 2 samples over 3 worlds)."""
    return {
        "n_steps": 3,
        "n_worlds": 3,
        "prompts_per_step": 3,
        "n_samples": 2,
        "rubric": Rubric(),
        "crash_driver_at_step": -1,
        "flaky_trial_rate": 0.0,
        "judge_flake_rate": 0.0,
        "seed": seed,
        "lr": 2.0,
        "max_turns": 6,
    }


FAULT_INPUTS = frozenset(f.name for f in fields(AgenticFaults))
"""The run inputs that are the tutorial's faults (wrapping the run's tiers); the others are the driver's config."""


def split_inputs(inputs: dict[str, Any]) -> tuple[AgenticConfig, AgenticFaults]:
    """A simulated run's inputs as the driver's config and the run's faults."""
    config = AgenticConfig(**{k: v for k, v in inputs.items() if k not in FAULT_INPUTS})
    return config, AgenticFaults(**{k: v for k, v in inputs.items() if k in FAULT_INPUTS})


class AgenticSim:
    """One simulator with the agentic tiers bound on it; `run` / `rerun` drive `rl.loop.agentic.run_agentic`."""

    def __init__(
        self,
        seed: int = 0,
        faults: FaultPlan | None = None,
        *,
        worlds: WorldStore | None = None,
        dead_trials: Iterable[str] = (),
        dead_judgings: Iterable[str] = (),
        tool_latency_s: float = 0.2,
        judge_latency_s: float = 0.5,
        trial_delay_s: Callable[[str], float] | None = None,
        driver: AgenticDriver = run_agentic,
        judge_tier: JudgeTierFactory = traced_judge_tier,
        policy_trainer: TrainerFactory = bandit_trainer,
        retries: dict[str, int] | None = None,
        tie_break_seed: int | None = None,
        loop_path: str = LOOP_PATH,
    ) -> None:
        self.seed = seed
        self.sim = DurableSimulator(seed, faults=faults, tie_break_seed=tie_break_seed, loop_path=loop_path)
        self.worlds: WorldStore = worlds if worlds is not None else MemoryWorlds()
        self.judge = BilledJudge(judge_latency_s)
        self.cluster = RunScopedCluster(factory=policy_trainer)
        self.driver_fn = driver
        self.sandbox = SandboxTier(self.worlds, run_name=run_name, tool_latency_s=tool_latency_s)
        self.dead_trials = frozenset(dead_trials)
        self.dead_judgings = frozenset(dead_judgings)
        self.tool_latency_s, self.trial_delay_s = tool_latency_s, trial_delay_s
        self.judge_tier = judge_tier(self.judge, lambda fn: self.sim.trace(fn, name=JUDGE_CALL))
        self.trainer = TrainerTier(self.cluster.attach)
        self.retries = retries

    def tiers(self, faults: AgenticFaults = NO_FAULTS) -> AgenticTiers:
        """The tiers of one run: tasks with the tutorial's options, their bodies and the tiers wrapped in `faults`.

        A trial waits out its delay and its dead-trial check before its flaky coin, as it always has.
        """
        sandbox = DeadAndSlowTrials(
            FlakyTrials(self.sandbox, faults.flaky_trial_rate, attempt_number),
            dead_trials=self.dead_trials,
            tool_latency_s=self.tool_latency_s,
            trial_delay_s=self.trial_delay_s,
        )
        judge: Judge = FlakyJudging(self.judge_tier, faults.judge_flake_rate, attempt_number)
        if self.dead_judgings:
            judge = DeadJudgings(judge, self.dead_judgings)
        tiers = SimAgenticTiers(self.sim, sandbox, judge, self.trainer, self.retries)
        return with_driver_crash(tiers, faults)

    async def driver(self, **inputs: Any) -> AgenticOutcome:
        config, faults = split_inputs(inputs)
        return await self.driver_fn(config, self.tiers(faults))

    def run(self, *, retries: int = 1, crash_at: int | Sequence[int] | None = None, **inputs: Any) -> RunResult:
        """Run the driver on `inputs` over `default_inputs(seed)`, with `retries` driver retries and `crash_at`."""
        unknown = set(inputs) - set(default_inputs())
        if unknown:
            raise TypeError(f"unknown driver inputs {sorted(unknown)}; known: {sorted(default_inputs())}")
        return self.sim.run(
            self.driver, inputs={**default_inputs(self.seed), **inputs}, retries=retries, crash_at=crash_at
        )

    def rerun(self, previous: RunResult, *, retries: int = 1, **changed: Any) -> RunResult:
        """Fork a finished run with changed inputs (`rubric=...`), recovering every action of unchanged identity."""
        return self.sim.rerun(previous, driver=self.driver, retries=retries, **changed)

    def trainer_of(self, result: RunResult) -> PolicyTrainer | None:
        return self.cluster.trainers.get(result.run_id)

    def report(self, result: RunResult) -> AgenticReport:
        return AgenticReport.of(self, result)


@dataclass(frozen=True)
class AgenticReport:
    """The agentic tutorial's failure table for one run, counted from the simulator's event log and the outcome."""

    ok: bool
    error: str
    trials_total: int
    trials_completed: int
    trials_skipped: int
    generate_succeeded: int
    trial_retries: int
    judge_succeeded: int
    judge_retries: int
    judge_calls: int
    judge_replays: int
    train_steps: int
    train_steps_replayed: int
    trainer_ids: list[int]
    driver_attempts: int
    mean_turns_by_step: list[float]
    mean_reward_by_step: list[float]
    virtual_time_s: float
    skipped: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, harness: AgenticSim, result: RunResult) -> AgenticReport:
        sim, run = harness.sim, result.run_id
        inputs = result.inputs
        outcome: AgenticOutcome | None = result.output if result.ok else None
        history = outcome.history if outcome is not None else []
        return cls(
            ok=result.ok,
            error="" if result.error is None else f"{type(result.error).__name__}: {result.error}",
            trials_total=inputs["n_steps"] * inputs["prompts_per_step"] * inputs["n_samples"],
            trials_completed=sum(h.n_trials for h in history),
            trials_skipped=len(outcome.skipped) if outcome is not None else 0,
            generate_succeeded=sim.count("action.completed", GENERATE, run),
            trial_retries=sim.count("action.retry", GENERATE, run),
            judge_succeeded=sim.count("action.completed", JUDGE, run),
            judge_retries=sim.count("action.retry", JUDGE, run),
            judge_calls=sim.count("trace.recorded", JUDGE_CALL, run),
            judge_replays=sim.count("trace.replayed", JUDGE_CALL, run),
            train_steps=sim.count("action.completed", TRAIN_STEP, run),
            train_steps_replayed=sim.count("action.replayed", TRAIN_STEP, run),
            trainer_ids=sorted({h.actor_pid for h in history}),
            driver_attempts=result.attempts,
            mean_turns_by_step=[h.mean_turns for h in history],
            mean_reward_by_step=[h.mean_reward for h in history],
            virtual_time_s=round(result.virtual_time_s, 3),
            skipped=[s.trial_id for s in outcome.skipped] if outcome is not None else [],
        )
