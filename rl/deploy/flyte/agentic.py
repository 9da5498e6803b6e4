"""The agentic tutorial's durable loop as Flyte tasks: thin recipes over `rl.agentic` and
`rl.loop.agentic.run_agentic`.

Tasks: `build_world` (cached), `generate` (`retries=1`, 300 s timeout), `verify_and_judge` (`retries=2`, the judge call
`@flyte.trace`d), `setup_trainer` and `train_step` (`retries=1`, 600 s timeout), and the driver `train` (`report=True`,
one `flyte.group` per step); `fork(run_name, rubric)` re-scores a finished run with `flyte.rerun`. None takes a fault
knob: the failure-injected run is `rl.deploy.flyte.agentic_faults.train_with_faults`. Design and the open-source
substitutes for Union features: docs/agentic.md.
"""

from __future__ import annotations

import math
import os
from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import flyte
import flyte.report
from pydantic import BaseModel, ConfigDict, model_validator

from rl.agentic.bandit import bandit_update, initial_weights, step_result
from rl.agentic.faults import AgenticFaults
from rl.agentic.judge import judge_score
from rl.agentic.tiers import JudgeTier, SandboxTier
from rl.deploy.flyte.agentic_report import render_agentic_report
from rl.deploy.flyte.bindings import attempt_number, is_local, task_context
from rl.deploy.flyte.cached_outputs import call_cached
from rl.deploy.flyte.dir_worlds import DirWorlds
from rl.deploy.flyte.envs import agentic_driver_env, agentic_trainer_env, judge_env, sandbox_env
from rl.deploy.flyte.strict import StrictConfig
from rl.errors import ConfigError, FaultInputError, RemoteOnlyError
from rl.loop.agentic import AgenticConfig, SkippedTrial, run_agentic
from rl.protocols import AgenticTiers
from rl.types import Reward, Rubric, StepResult, Trajectory, TrialSpec, Weights, WorldRef

__all__ = [
    "AgenticRunConfig",
    "AgenticRunResult",
    "FlyteAgenticTiers",
    "agentic_driver_env",
    "build_world",
    "call_judge",
    "fork",
    "generate",
    "setup_trainer",
    "train",
    "train_step",
    "verify_and_judge",
]

GENERATE_TIMEOUT_S = 300.0
GENERATE_TIMEOUT = flyte.Timeout(max_runtime=timedelta(seconds=GENERATE_TIMEOUT_S))
TRAIN_TIMEOUT = flyte.Timeout(max_runtime=timedelta(seconds=600))

REMOTE_ONLY = (
    "driver replay: a retried driver replays completed actions from the durable record (local mode re-runs the "
    "driver body, and train_with_faults refuses crash_driver_at_step: local mode never sets FLYTE_ATTEMPT_NUMBER)",
    "trace memo: @flyte.trace replays call_judge on a retried verify_and_judge (local mode calls the judge again)",
    "attempt-0-only faults: train_with_faults' flaky_trial_rate and judge_flake_rate fire on attempt 0 only (local "
    "mode reports every attempt as 0, so an injected fault repeats on each retry and the trial is skipped)",
    "rerun: fork(run, rubric) forks a finished run with flyte.rerun(recover=True) (local mode raises; re-score locally "
    "by running train again with the new rubric, and the cache reuses the worlds and unchanged rollouts)",
    "timeouts: flyte.Timeout bounds generate and train_step (local mode does not enforce them)",
)


MAX_WORLDS = 1024  # each world is a cached task and a sealed Dir; more than this is a typo, not a run


class AgenticRunConfig(StrictConfig):
    """The run's shape (the agentic tutorial's defaults: 3 steps x 3 prompts x 2 samples over 3 worlds) and its tool
    latency.

    Checked when built (from Python or `--config` JSON): unknown keys, counts below 1, more worlds than prompts per
    step (prompt p explores world p mod W, so the rest would never be explored), a learning rate that is not a
    finite positive number, and a tool latency whose `max_turns` calls alone outlast `generate`'s timeout."""

    n_steps: int = 3
    n_worlds: int = 3
    prompts_per_step: int = 3
    n_samples: int = 2
    seed: int = 0
    lr: float = 2.0
    max_turns: int = 6
    tool_latency_s: float = 0.2

    @model_validator(mode="after")
    def _check(self) -> AgenticRunConfig:
        counts = {name: getattr(self, name) for name in ("n_steps", "n_worlds", "prompts_per_step", "n_samples")}
        for name, value in {**counts, "max_turns": self.max_turns}.items():
            if value < 1:
                raise ConfigError(f"{name} must be >= 1, got {value}")
        if self.n_worlds > min(self.prompts_per_step, MAX_WORLDS):
            raise ConfigError(
                f"n_worlds {self.n_worlds} is more than the {self.prompts_per_step} prompts per step explore (prompt p "
                f"explores world p mod n_worlds; at most {MAX_WORLDS}): lower n_worlds or raise prompts_per_step"
            )
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise ConfigError(f"lr must be a finite number > 0, got {self.lr}")
        budget_s = GENERATE_TIMEOUT_S
        if not (math.isfinite(self.tool_latency_s) and 0 <= self.tool_latency_s * self.max_turns < budget_s):
            raise ConfigError(
                f"tool_latency_s must be >= 0 with max_turns x tool_latency_s under generate's {budget_s:g} s "
                f"timeout, got {self.tool_latency_s} x {self.max_turns} turns"
            )
        return self

    def check_faults(self, faults: AgenticFaults) -> None:
        """Refuse injected faults that cannot work with this config, before any task starts."""
        try:
            faults.check(self.n_steps)
        except FaultInputError as exc:
            raise ConfigError(str(exc)) from None

    def driver_config(self, rubric: Rubric) -> AgenticConfig:
        """The driver's own config: this run's shape, judged with `rubric`."""
        return AgenticConfig(
            n_steps=self.n_steps,
            n_worlds=self.n_worlds,
            prompts_per_step=self.prompts_per_step,
            n_samples=self.n_samples,
            rubric=rubric,
            seed=self.seed,
            lr=self.lr,
            max_turns=self.max_turns,
        )


SMOKE = AgenticRunConfig()
STRESS = AgenticRunConfig(n_steps=10, n_worlds=8, prompts_per_step=16, n_samples=4)
DEFAULT_RUBRIC = Rubric()


class AgenticRunResult(BaseModel):
    """The driver task's output: the loop's outcome, whether it ran in local mode, and what that mode could not show.

    A pydantic model because it crosses a task boundary (Flyte serialises a task's output by its type); the loop's own
    `AgenticOutcome` and `SkippedTrial` are frozen dataclasses, which pydantic serialises as fields of this model."""

    model_config = ConfigDict(frozen=True)

    history: list[StepResult]
    skipped: list[SkippedTrial]
    driver_attempt: int
    local_mode: bool
    remote_only: list[str]


def _run_name() -> str:
    return task_context().action.run_name or "local"


# ----------------------------------------------------------------------------------------------------------- tasks

JUDGE_CALLS: Counter[tuple[str, str]] = Counter()
"""Judge calls this process made, by (trial, rubric): the tutorial counts "JUDGE CALLED" log lines the same way."""


@flyte.trace
async def call_judge(traj: Trajectory, rubric: Rubric) -> float:
    """The vendor LLM judge's stand-in (`rl.agentic.judge.judge_score`). Traced: a retry replays, never re-bills."""
    JUDGE_CALLS[(traj.trial_id, rubric.name)] += 1
    flyte.logger.info(f"JUDGE CALLED trial={traj.trial_id} rubric={rubric.name}")
    return judge_score(traj, rubric)


@sandbox_env.task(cache="auto")
async def build_world(world_id: str, seed: int) -> WorldRef:
    """Populate the world's files once and seal them; every trial forks this version."""
    async with DirWorlds() as worlds:
        return await SandboxTier(worlds, run_name=_run_name).build_world(world_id, seed)


async def generate_in_a_copy(
    spec: TrialSpec, weights: Weights, world: WorldRef, tool_latency_s: float, wrap: Callable[[Any], Any] = lambda t: t
) -> Trajectory:
    """`generate`'s body: the trial in a private copy of its world, through `wrap(sandbox tier)`."""
    async with DirWorlds() as worlds:
        await worlds.prefetch(world.version)
        sandbox = wrap(SandboxTier(worlds, run_name=_run_name, tool_latency_s=tool_latency_s))
        traj: Trajectory = await sandbox.generate(spec, weights, world)
        return traj


@sandbox_env.task(cache="auto", retries=1, timeout=GENERATE_TIMEOUT)
async def generate(spec: TrialSpec, weights: Weights, world: WorldRef, tool_latency_s: float = 0.2) -> Trajectory:
    """One trial in a private copy of its world, driven by the current weights; seeded by the trial id."""
    return await generate_in_a_copy(spec, weights, world, tool_latency_s)


@judge_env.task(retries=2)
async def verify_and_judge(traj: Trajectory, rubric: Rubric) -> Reward:
    """The deterministic verifier, then the (traced) judge against `rubric`; reward = 1[verified] + judge score."""
    return await JudgeTier(call_judge).verify_and_judge(traj, rubric)


@agentic_trainer_env.task
async def setup_trainer(world_ids: list[str]) -> Weights:
    """Version 0: a uniform prior over every world's documents."""
    return initial_weights(world_ids)


@agentic_trainer_env.task(retries=1, timeout=TRAIN_TIMEOUT)
async def train_step(step: int, weights: Weights, rewards: list[Reward], lr: float = 2.0) -> StepResult:
    """One bandit update as a pure function of (weights, canonical rewards, lr): a replayed step recomputes it."""
    if weights.version != step:
        raise ValueError(f"step {step} must train weights version {step}, got version {weights.version}")
    return step_result(step, rewards, bandit_update(weights, rewards, lr), os.getpid())


# ------------------------------------------------------------------------------- the tiers, as awaits of the tasks


class FlyteAgenticTiers:
    """`rl.protocols.AgenticTiers` whose methods await the tasks above; publishes the report after every step.

    The trainer is pure, so these tiers hand it the weights it trains: those of `setup_trainer`, then of each step.
    """

    def __init__(self, config: AgenticRunConfig, rubric: Rubric, notes: list[str]) -> None:
        self.config, self.notes = config, notes
        self.driver = config.driver_config(rubric)
        self.weights: Weights | None = None
        self.history: list[StepResult] = []

    def driver_attempt(self) -> int:
        return attempt_number()

    async def build_world(self, world_id: str, seed: int) -> WorldRef:
        return await call_cached(build_world, world_id, seed, names=lambda world: [world.version])

    async def setup_trainer(self, world_ids: list[str]) -> Weights:
        self.weights = await setup_trainer(world_ids)
        return self.weights

    async def generate(self, spec: TrialSpec, weights: Weights, world: WorldRef) -> Trajectory:
        return await generate(spec, weights, world, self.config.tool_latency_s)

    async def verify_and_judge(self, traj: Trajectory, rubric: Rubric) -> Reward:
        return await verify_and_judge(traj, rubric)

    async def train_step(self, step: int, rewards: list[Reward], world_ids: list[str], lr: float) -> StepResult:
        if self.weights is None:
            raise RuntimeError("setup_trainer must run before the first train_step")
        result = await train_step(step, self.weights, rewards, lr)
        self.weights = result.weights
        self.history.append(result)
        await self.publish("running")
        return result

    async def publish(self, status: str, skipped: list[SkippedTrial] | None = None) -> None:
        await flyte.report.replace.aio(
            render_agentic_report(self.history, self.driver, status, self.notes, skipped or []),
            do_flush=True,
        )


@agentic_driver_env.task(report=True, retries=1)
async def train(config: AgenticRunConfig = SMOKE, rubric: Rubric = DEFAULT_RUBRIC) -> AgenticRunResult:
    """The agentic tutorial's driver: build worlds, attach the trainer, then per step fan out trials, judge each as it
    lands, skip failed trials, and take one train step on canonically ordered rewards."""
    return await drive(FlyteAgenticTiers(config, rubric, remote_only_notes()))


def remote_only_notes() -> list[str]:
    """What this run cannot show: everything in `REMOTE_ONLY` in Flyte's local mode, nothing on a cluster."""
    return list(REMOTE_ONLY) if is_local() else []


async def drive(
    tiers: FlyteAgenticTiers, wrap: Callable[[AgenticTiers], AgenticTiers] = lambda t: t
) -> AgenticRunResult:
    """The driver task's body: `run_agentic` over `wrap(tiers)`, one `flyte.group` per step, then the final report."""
    outcome = await run_agentic(tiers.driver, wrap(tiers), span=flyte.group)
    await tiers.publish("complete", outcome.skipped)
    return AgenticRunResult(
        history=outcome.history,
        skipped=outcome.skipped,
        driver_attempt=outcome.driver_attempt,
        local_mode=is_local(),
        remote_only=tiers.notes,
    )


def fork(run_name: str, rubric: Rubric, force_rerun_actions: list[str] | None = None) -> Any:
    """Fork the finished run `run_name` with a new rubric, recovering its succeeded actions (a Flyte cluster only).

    Needs `flyte.init_from_config()` first. On flyte 2.12 recovery matches the source run's succeeded actions by their
    deterministic names; name an action in `force_rerun_actions` to re-execute it against the new inputs anyway.
    Returns the new `flyte.remote.Run`.
    """
    try:
        return flyte.rerun(run_name, recover=True, force_rerun_actions=force_rerun_actions, rubric=rubric)
    except NotImplementedError as exc:
        raise RemoteOnlyError(
            f"fork needs a Flyte cluster (flyte.rerun says: {exc}). Locally, re-score by running train again with the "
            "new rubric: the cached build_world and generate actions are reused, judging and training re-run"
        ) from exc
