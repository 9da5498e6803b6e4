"""The bodies of the agentic tutorial's tasks, over injected stores and services: what a Flyte task or a simulator task
wraps.

- `SandboxTier.build_world` / `.generate`: seal a world once; fork it per trial, run the agent there, seal the fork.
- `JudgeTier.verify_and_judge`: the verifier plus `call_judge`, memoised by the binding (`@flyte.trace`, `sim.trace`).
- `TrainerTier.setup_trainer` / `.train_step`: attach the long-lived trainer by name (get-or-create) and update it.

They carry no fault knob: the tutorial's injected failures wrap them (`rl.agentic.faults`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from rl.agentic.agent import run_trial
from rl.agentic.bandit import PolicyTrainer, step_result
from rl.agentic.judge import make_reward, verify
from rl.agentic.world import world_files
from rl.protocols import WorldStore
from rl.types import Reward, Rubric, StepResult, Trajectory, TrialSpec, Weights, WorldRef


def _no_run_name() -> str:
    return "local"


class SandboxTier:
    """Worlds and trials. `run_name` names world volumes per run, as the tutorial's `flyte.ctx().action.run_name`
    does."""

    def __init__(
        self,
        worlds: WorldStore,
        *,
        run_name: Callable[[], str] = _no_run_name,
        tool_latency_s: float = 0.2,
    ) -> None:
        self.worlds, self.run_name, self.tool_latency_s = worlds, run_name, tool_latency_s

    async def build_world(self, world_id: str, seed: int) -> WorldRef:
        """Populate the world's files once and seal them read-only; every trial forks this version."""
        name = f"world-{world_id}-{self.run_name()}"
        version = self.worlds.seal(name, world_files(seed, world_id), f"world {world_id}")
        return WorldRef(world_id=world_id, name=name, version=version)

    async def generate(self, spec: TrialSpec, weights: Weights, world: WorldRef) -> Trajectory:
        """One trial in a fresh private fork of its world; the parent version never changes."""
        if world.world_id != spec.world_id:
            raise ValueError(f"trial {spec.trial_id} is for world {spec.world_id} but was given world {world.world_id}")
        workspace = self.worlds.fork(world.version, f"{world.name}-{spec.trial_id}")
        try:
            traj = await run_trial(spec, weights, workspace, tool_latency_s=self.tool_latency_s)
        except BaseException:
            workspace.abandon()
            raise
        workspace.finalize(f"trial {spec.trial_id}")
        return traj


class JudgeTier:
    """Verify and judge one trajectory. `call_judge` must be memoised by the binding, or retries re-bill the judge."""

    def __init__(self, call_judge: Callable[[Trajectory, Rubric], Awaitable[float]]) -> None:
        self.call_judge = call_judge

    async def verify_and_judge(self, traj: Trajectory, rubric: Rubric) -> Reward:
        verified = verify(traj)
        score = await self.call_judge(traj, rubric)
        return make_reward(traj, verified, score)


class TrainerTier:
    """Steps on the long-lived trainer, re-attached by name on every call (module globals don't survive a task)."""

    def __init__(self, attach: Callable[[Sequence[str]], PolicyTrainer]) -> None:
        self.attach = attach

    async def setup_trainer(self, world_ids: list[str]) -> Weights:
        """Create the trainer once per run (or re-attach to it) and return its current weights."""
        return self.attach(world_ids).weights()

    async def train_step(self, step: int, rewards: list[Reward], world_ids: list[str], lr: float = 2.0) -> StepResult:
        """One exactly-once update; returns the new (small) weights and the step's summary."""
        trainer = self.attach(world_ids)
        weights = trainer.update(step, rewards, lr)
        return step_result(step, rewards, weights, trainer.info().identity)


class LocalAgenticTiers:
    """The tiers as plain in-process calls, to run the loop outside Flyte and the simulator (no retries, attempt 0).

    With `SandboxTier(VolumeWorlds(LocalVolumeStore(root)))` every trial forks a real copy-on-write local volume.
    """

    def __init__(self, sandbox: SandboxTier, judge: JudgeTier, trainer: TrainerTier) -> None:
        self.sandbox, self.judge, self.trainer = sandbox, judge, trainer

    def driver_attempt(self) -> int:
        return 0

    async def build_world(self, world_id: str, seed: int) -> WorldRef:
        return await self.sandbox.build_world(world_id, seed)

    async def setup_trainer(self, world_ids: list[str]) -> Weights:
        return await self.trainer.setup_trainer(world_ids)

    async def generate(self, spec: TrialSpec, weights: Weights, world: WorldRef) -> Trajectory:
        return await self.sandbox.generate(spec, weights, world)

    async def verify_and_judge(self, traj: Trajectory, rubric: Rubric) -> Reward:
        return await self.judge.verify_and_judge(traj, rubric)

    async def train_step(self, step: int, rewards: list[Reward], world_ids: list[str], lr: float) -> StepResult:
        return await self.trainer.train_step(step, rewards, world_ids, lr)
