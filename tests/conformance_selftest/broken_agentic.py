"""Broken parts of the agentic loop (the agentic tutorial), each a real bug; the suite must fail each on the right
law."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rl.agentic.bandit import BanditTrainer, bandit_update
from rl.agentic.faults import ForwardingTiers
from rl.agentic.tiers import JudgeTier
from rl.conformance import Implementation
from rl.loop.agentic import AgenticConfig, AgenticOutcome, run_agentic
from rl.protocols import AgenticTiers
from rl.types import Reward, Rubric, StepResult, Trajectory, TrialSpec, Weights, WorldRef


def untraced_judge_tier(judge: Any, trace: Any) -> JudgeTier:
    """Calls the vendor judge directly, not under the durable trace: a retried judging task bills again."""
    return JudgeTier(judge)


class TrialKeyedJudgeTier(JudgeTier):
    """Memoises the judge's score by trial id alone, so a retry never re-bills; but a fork that re-scores the run with
    a new rubric gets the old rubric's scores back, and the judge is never asked."""

    def __init__(self, judge: Any) -> None:
        self.scores: dict[str, float] = {}

        async def call_judge(traj: Trajectory, rubric: Rubric) -> float:
            if traj.trial_id not in self.scores:
                self.scores[traj.trial_id] = await judge(traj, rubric)
            return self.scores[traj.trial_id]

        super().__init__(call_judge)


def trial_keyed_judge_tier(judge: Any, trace: Any) -> JudgeTier:
    return TrialKeyedJudgeTier(judge)


class NoLedgerTrainer(BanditTrainer):
    """Applies every update it is sent: a re-sent step (a retried task) is applied twice."""

    def update(self, step: int, rewards: Sequence[Reward], lr: float) -> Weights:
        self._weights = bandit_update(self._weights, rewards, lr)
        self.applications[step] += 1
        return self._weights


def no_ledger_trainer(world_ids: Sequence[str], identity: int) -> NoLedgerTrainer:
    return NoLedgerTrainer(world_ids, identity=identity)


class SilentReplayTrainer(BanditTrainer):
    """Returns the recorded weights for any step id it has applied, whatever the payload: a replay that drifted (other
    rewards, another order) goes unnoticed and the run trains on rewards it never applied."""

    def update(self, step: int, rewards: Sequence[Reward], lr: float) -> Weights:
        done = self._applied.get(step)
        return done.weights if done is not None else super().update(step, rewards, lr)


def silent_replay_trainer(world_ids: Sequence[str], identity: int) -> SilentReplayTrainer:
    return SilentReplayTrainer(world_ids, identity=identity)


class LandingOrderTiers(ForwardingTiers):
    """The driver's tiers, handing each train step its rewards in the order their trials landed (generate returned)
    instead of the canonical order the driver sends: the tutorial's first version, before its one `sorted()`."""

    def __init__(self, inner: AgenticTiers) -> None:
        super().__init__(inner)
        self.landed: list[str] = []

    async def generate(self, spec: TrialSpec, weights: Weights, world: WorldRef) -> Trajectory:
        traj = await self.inner.generate(spec, weights, world)
        self.landed.append(spec.trial_id)
        return traj

    async def train_step(self, step: int, rewards: list[Reward], world_ids: list[str], lr: float) -> StepResult:
        order = {trial_id: i for i, trial_id in enumerate(self.landed)}
        landed = sorted(rewards, key=lambda r: order[r.trial_id])
        return await self.inner.train_step(step, landed, world_ids, lr)


async def landing_order_driver(config: AgenticConfig, tiers: AgenticTiers) -> AgenticOutcome:
    """The agentic tutorial's first version: each step's rewards go to the trainer in the order the trials landed."""
    return await run_agentic(config, LandingOrderTiers(tiers))


async def fatal_failed_trial_driver(config: AgenticConfig, tiers: AgenticTiers) -> AgenticOutcome:
    """Treats a trial that failed every retry as fatal to the run instead of skipping it."""
    outcome = await run_agentic(config, tiers)
    if outcome.skipped:
        raise RuntimeError(f"trial {outcome.skipped[0].trial_id} failed: {outcome.skipped[0].reason}")
    return outcome


UNTRACED_JUDGE = Implementation(name="untraced-judge", judge_tier=untraced_judge_tier)
TRIAL_KEYED_JUDGE = Implementation(name="judge-memo-ignores-the-rubric", judge_tier=trial_keyed_judge_tier)
NO_LEDGER = Implementation(name="no-ledger-trainer", policy_trainer=no_ledger_trainer)
SILENT_REPLAY = Implementation(name="payload-conflict-ignored", policy_trainer=silent_replay_trainer)
UNSORTED_REWARDS = Implementation(name="rewards-in-landing-order", agentic_driver=landing_order_driver)
FATAL_FAILED_TRIAL = Implementation(name="failed-trial-is-fatal", agentic_driver=fatal_failed_trial_driver)
