"""The agentic driver's `span` hook (the `flyte.group` role): each step's actions run inside `step-<N>`.

The Flyte binding (`rl.deploy.flyte.agentic`) passes `flyte.group`; a context variable stands in for Flyte's task
context.
"""

from __future__ import annotations

import asyncio

from span_support import CURRENT, recording_span

from rl.agentic.bandit import BanditTrainer
from rl.agentic.judge import judge_score
from rl.agentic.tiers import JudgeTier, LocalAgenticTiers, SandboxTier, TrainerTier
from rl.deploy.simulated.worlds import MemoryWorlds
from rl.loop.agentic import AgenticConfig, run_agentic
from rl.types import Reward, Rubric, StepResult, Trajectory, TrialSpec, Weights, WorldRef

SMALL = AgenticConfig(n_steps=2, n_worlds=2, prompts_per_step=2, n_samples=2)


async def _judge(traj: Trajectory, rubric: Rubric) -> float:
    return judge_score(traj, rubric)


class _Recording(LocalAgenticTiers):
    def __init__(self) -> None:
        trainers: dict[str, BanditTrainer] = {}
        super().__init__(
            SandboxTier(MemoryWorlds(), tool_latency_s=0.0),
            JudgeTier(_judge),
            TrainerTier(lambda world_ids: trainers.setdefault("policy", BanditTrainer(world_ids, identity=1))),
        )
        self.seen: list[tuple[str, str, str | None]] = []

    async def build_world(self, world_id: str, seed: int) -> WorldRef:
        self.seen.append(("build_world", world_id, CURRENT.get()))
        return await super().build_world(world_id, seed)

    async def generate(self, spec: TrialSpec, weights: Weights, world: WorldRef) -> Trajectory:
        self.seen.append(("generate", spec.trial_id, CURRENT.get()))
        return await super().generate(spec, weights, world)

    async def verify_and_judge(self, traj: Trajectory, rubric: Rubric) -> Reward:
        self.seen.append(("verify_and_judge", traj.trial_id, CURRENT.get()))
        return await super().verify_and_judge(traj, rubric)

    async def train_step(self, step: int, rewards: list[Reward], world_ids: list[str], lr: float) -> StepResult:
        self.seen.append(("train_step", f"s{step}", CURRENT.get()))
        return await super().train_step(step, rewards, world_ids, lr)


def test_every_trial_judgment_and_train_step_runs_inside_its_steps_group():
    """The agentic tutorial: `with flyte.group(f"step-{step}")` holds a step's trials, judgments and train step; worlds
    are outside."""
    tiers = _Recording()
    asyncio.run(run_agentic(SMALL, tiers, span=recording_span))
    for kind, key, group in tiers.seen:
        if kind == "build_world":
            assert group is None
        else:
            assert group == f"step-{key.split('-')[0].removeprefix('s')}", (kind, key, group)
    assert {kind for kind, _, _ in tiers.seen} == {"build_world", "generate", "verify_and_judge", "train_step"}


def test_without_a_span_the_agentic_driver_opens_none():
    tiers = _Recording()
    asyncio.run(run_agentic(SMALL, tiers))
    assert {group for _, _, group in tiers.seen} == {None}
