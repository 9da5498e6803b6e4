"""The agentic tutorial's injected faults, each a wrapper of a tier (as `CrashAfterCheckpoint` wraps GRPO's state
store).

- `FlakyTrials`: around a sandbox tier's `generate` (a task body): the trial's sandbox dies on attempt 0 when its seeded
  coin falls under the rate; the retry regenerates the identical trajectory.
- `FlakyJudging`: around a judge tier's `verify_and_judge` (a task body): judging fails on attempt 0 *after* the judge
  answered, with a seeded probability; the retry must replay the recorded answer, not bill the judge again.
- `CrashAfterStep`: around the driver's tiers: driver attempt 0 dies right after a chosen step's train step returned.
  Like any wrapper of the driver's tiers, it subclasses `ForwardingTiers` and overrides only what it changes.

The coins are the tutorial's: seeded by (run seed, trial id), so the same trials fail on every run of a seed.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from rl.agentic.agent import sandbox_coin
from rl.errors import FaultInputError, InjectedDriverCrash, JudgeFlake, SandboxFailure
from rl.protocols import AgenticTiers
from rl.seeding import derive_seed
from rl.types import Reward, Rubric, StepResult, Trajectory, TrialSpec, Weights, WorldRef


@dataclass(frozen=True)
class AgenticFaults:
    """The tutorial's failure injection for one run: none by default. `rl demo agentic`'s failure-injected run is
    `AgenticFaults(flaky_trial_rate=0.25, judge_flake_rate=0.3, crash_driver_at_step=1)`."""

    flaky_trial_rate: float = 0.0
    judge_flake_rate: float = 0.0
    crash_driver_at_step: int = -1

    def check(self, n_steps: int) -> None:
        """Refuse a rate outside [0, 1] or a crash step beyond the run's `n_steps`."""
        if not -1 <= self.crash_driver_at_step < n_steps:
            raise FaultInputError(
                f"crash_driver_at_step {self.crash_driver_at_step} is beyond the run's {n_steps} steps "
                f"(0..{n_steps - 1}); pick one of those, or -1 for no crash"
            )
        for name, rate in (("flaky_trial_rate", self.flaky_trial_rate), ("judge_flake_rate", self.judge_flake_rate)):
            if not 0.0 <= rate <= 1.0:
                raise FaultInputError(f"{name} must be a probability in [0, 1], got {rate}")


def judge_flakes(traj: Trajectory, attempt: int, flake_rate: float) -> bool:
    """The agentic tutorial's post-judge failure: on attempt 0, with probability `flake_rate`, seeded per trial id."""
    return attempt == 0 and random.Random(derive_seed("flake", traj.seed, traj.trial_id)).random() < flake_rate


class Sandbox(Protocol):
    """A sandbox tier (`rl.agentic.tiers.SandboxTier` or a wrapper of one)."""

    async def build_world(self, world_id: str, seed: int) -> WorldRef: ...

    async def generate(self, spec: TrialSpec, weights: Weights, world: WorldRef) -> Trajectory: ...


class Judge(Protocol):
    """A judge tier (`rl.agentic.tiers.JudgeTier`, or a fork's)."""

    async def verify_and_judge(self, traj: Trajectory, rubric: Rubric) -> Reward: ...


class FlakyTrials:
    """A sandbox tier whose trials die on attempt 0 with probability `rate` (the agentic tutorial's `flaky_rate`)."""

    def __init__(self, inner: Sandbox, rate: float, attempt: Callable[[], int]) -> None:
        self.inner, self.rate, self.attempt = inner, rate, attempt

    async def build_world(self, world_id: str, seed: int) -> WorldRef:
        return await self.inner.build_world(world_id, seed)

    async def generate(self, spec: TrialSpec, weights: Weights, world: WorldRef) -> Trajectory:
        if sandbox_coin(spec) < self.rate and self.attempt() == 0:
            raise SandboxFailure(f"simulated sandbox failure for {spec.trial_id} (attempt 0); a retry regenerates it")
        return await self.inner.generate(spec, weights, world)


class FlakyJudging:
    """A judge tier whose judging fails on attempt 0 after the judge answered, with probability `rate`."""

    def __init__(self, inner: Judge, rate: float, attempt: Callable[[], int]) -> None:
        self.inner, self.rate, self.attempt = inner, rate, attempt

    async def verify_and_judge(self, traj: Trajectory, rubric: Rubric) -> Reward:
        reward = await self.inner.verify_and_judge(traj, rubric)
        if judge_flakes(traj, self.attempt(), self.rate):
            raise JudgeFlake(
                f"simulated post-judge failure for {traj.trial_id} (attempt 0); the retry must not re-call the judge"
            )
        return reward


class ForwardingTiers:
    """`AgenticTiers` that forward every call to `inner`: a wrapper subclasses it and overrides only what it changes."""

    def __init__(self, inner: AgenticTiers) -> None:
        self.inner = inner

    def driver_attempt(self) -> int:
        return self.inner.driver_attempt()

    async def build_world(self, world_id: str, seed: int) -> WorldRef:
        return await self.inner.build_world(world_id, seed)

    async def setup_trainer(self, world_ids: list[str]) -> Weights:
        return await self.inner.setup_trainer(world_ids)

    async def generate(self, spec: TrialSpec, weights: Weights, world: WorldRef) -> Trajectory:
        return await self.inner.generate(spec, weights, world)

    async def verify_and_judge(self, traj: Trajectory, rubric: Rubric) -> Reward:
        return await self.inner.verify_and_judge(traj, rubric)

    async def train_step(self, step: int, rewards: list[Reward], world_ids: list[str], lr: float) -> StepResult:
        return await self.inner.train_step(step, rewards, world_ids, lr)


class CrashAfterStep(ForwardingTiers):
    """The driver's tiers, killing driver attempt 0 right after step `step`'s train step returned (the agentic
    tutorial's `crash_driver_at_step`); the retried driver must replay steps 0..step and run the rest."""

    def __init__(self, inner: AgenticTiers, step: int) -> None:
        super().__init__(inner)
        self.step = step

    async def train_step(self, step: int, rewards: list[Reward], world_ids: list[str], lr: float) -> StepResult:
        result = await self.inner.train_step(step, rewards, world_ids, lr)
        if step == self.step and self.inner.driver_attempt() == 0:
            raise InjectedDriverCrash(f"driver crash after step {step} on attempt 0 (crash_driver_at_step={step})")
        return result


def with_driver_crash(tiers: AgenticTiers, faults: AgenticFaults) -> AgenticTiers:
    """`tiers`, wrapped to crash as `faults` says (unwrapped when it says no crash)."""
    return CrashAfterStep(tiers, faults.crash_driver_at_step) if faults.crash_driver_at_step >= 0 else tiers
