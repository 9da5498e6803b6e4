"""The GRPO drivers' failure-injected runs on Flyte: `train_rl_with_faults` and `train_rl_clustered_with_faults`.

The production drivers (`train_rl`, `train_rl_clustered`) take no fault knob. These twins run the same body with the
checkpoint store wrapped in `CrashAfterCheckpoint`, so the driver task itself dies once right after checkpointing the
chosen iteration and Flyte retries it: the way to watch a driver resume, as the agentic loop's `train_with_faults`.
"""

from __future__ import annotations

from rl.deploy.flyte.clustered import PIPELINED, train_step_clustered
from rl.deploy.flyte.config import FaultSpec, GrpoRunConfig
from rl.deploy.flyte.envs import grpo_clustered_driver_env, grpo_driver_env
from rl.deploy.flyte.grpo import SMOKE, GrpoRunResult, run_driver
from rl.deploy.flyte.grpo_tasks import train_step

CRASH_ONCE = FaultSpec(crash_after_iteration=1)


@grpo_driver_env.task(report=True, retries=2)
async def train_rl_with_faults(config: GrpoRunConfig = SMOKE, faults: FaultSpec = CRASH_ONCE) -> GrpoRunResult:
    """`train_rl`, whose driver dies once right after checkpointing `faults.crash_after_iteration`."""
    return await run_driver(config, step_task=train_step, title="GRPO + LoRA (failure-injected)", faults=faults)


@grpo_clustered_driver_env.task(report=True, retries=2)
async def train_rl_clustered_with_faults(
    config: GrpoRunConfig = PIPELINED, faults: FaultSpec = CRASH_ONCE
) -> GrpoRunResult:
    """`train_rl_clustered`, whose driver dies once right after checkpointing `faults.crash_after_iteration`."""
    return await run_driver(
        config, step_task=train_step_clustered, title="GRPO + LoRA, clustered trainer (failure-injected)", faults=faults
    )
