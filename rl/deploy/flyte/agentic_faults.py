"""The agentic tutorial's failure-injected run on Flyte: `train_with_faults`, the agentic driver with its tiers wrapped
in faults.

The production tasks take no fault knob, and a fault that should be retried must fail a *task*, so the injected ones
are tasks of their own: `flaky_generate` and `flaky_verify_and_judge` are `generate` and `verify_and_judge` (same
options) with `rl.agentic.faults`' wrappers around the same bodies; `train_with_faults` drives them, wrapped in
`CrashAfterStep`, so the driver task itself dies after the chosen step and Flyte retries it.
"""

from __future__ import annotations

import functools

from rl.agentic.faults import AgenticFaults, FlakyJudging, FlakyTrials, with_driver_crash
from rl.agentic.tiers import JudgeTier
from rl.deploy.flyte.agentic import (
    DEFAULT_RUBRIC,
    GENERATE_TIMEOUT,
    SMOKE,
    AgenticRunConfig,
    AgenticRunResult,
    FlyteAgenticTiers,
    call_judge,
    drive,
    generate_in_a_copy,
    remote_only_notes,
)
from rl.deploy.flyte.bindings import attempt_number, is_local
from rl.deploy.flyte.envs import agentic_driver_env, judge_env, sandbox_env
from rl.deploy.flyte.strict import StrictConfig
from rl.errors import RemoteOnlyError
from rl.types import Reward, Rubric, Trajectory, TrialSpec, Weights, WorldRef


class AgenticFaultSpec(StrictConfig):
    """`train_with_faults`' faults as a task input: the fields of `rl.agentic.faults.AgenticFaults`, which it becomes
    (`faults()`). A pydantic model, not that dataclass: as a task's own input, Flyte's CLI would drop a misspelt
    `--faults` key of a dataclass without a word."""

    flaky_trial_rate: float = 0.0
    judge_flake_rate: float = 0.0
    crash_driver_at_step: int = -1

    def faults(self) -> AgenticFaults:
        return AgenticFaults(**self.model_dump())


NO_FAULTS = AgenticFaultSpec()


@sandbox_env.task(cache="auto", retries=1, timeout=GENERATE_TIMEOUT)
async def flaky_generate(
    spec: TrialSpec, weights: Weights, world: WorldRef, flaky_rate: float, tool_latency_s: float = 0.2
) -> Trajectory:
    """`generate` whose sandbox dies on attempt 0 when the trial's seeded coin falls under `flaky_rate`."""
    flaky = functools.partial(FlakyTrials, rate=flaky_rate, attempt=attempt_number)
    return await generate_in_a_copy(spec, weights, world, tool_latency_s, wrap=flaky)


@judge_env.task(retries=2)
async def flaky_verify_and_judge(traj: Trajectory, rubric: Rubric, judge_flake_rate: float) -> Reward:
    """`verify_and_judge` failing on attempt 0 after the traced judge answered, with probability `judge_flake_rate`."""
    return await FlakyJudging(JudgeTier(call_judge), judge_flake_rate, attempt_number).verify_and_judge(traj, rubric)


class FlakyFlyteTiers(FlyteAgenticTiers):
    """`FlyteAgenticTiers` whose trials and judgments run as the flaky tasks above, at `faults`' rates."""

    def __init__(self, config: AgenticRunConfig, rubric: Rubric, notes: list[str], faults: AgenticFaults) -> None:
        super().__init__(config, rubric, notes)
        self.faults = faults

    async def generate(self, spec: TrialSpec, weights: Weights, world: WorldRef) -> Trajectory:
        return await flaky_generate(spec, weights, world, self.faults.flaky_trial_rate, self.config.tool_latency_s)

    async def verify_and_judge(self, traj: Trajectory, rubric: Rubric) -> Reward:
        return await flaky_verify_and_judge(traj, rubric, self.faults.judge_flake_rate)


@agentic_driver_env.task(report=True, retries=1)
async def train_with_faults(
    config: AgenticRunConfig = SMOKE, rubric: Rubric = DEFAULT_RUBRIC, faults: AgenticFaultSpec = NO_FAULTS
) -> AgenticRunResult:
    """`train` with the agentic tutorial's injected faults: flaky sandboxes, judge flakes, a driver crash after one
    step."""
    plan = faults.faults()
    config.check_faults(plan)
    if is_local() and plan.crash_driver_at_step >= 0:
        raise RemoteOnlyError(
            "crash_driver_at_step needs a cluster: Flyte's local mode never sets FLYTE_ATTEMPT_NUMBER, so the crash "
            "would repeat on every attempt. The simulator shows the replay: rl demo agentic --crash-driver-at-step 1"
        )
    tiers = FlakyFlyteTiers(config, rubric, remote_only_notes(), plan)
    return await drive(tiers, wrap=lambda inner: with_driver_crash(inner, plan))
