"""The GRPO + LoRA loop of the training-loop and rollouts tutorials on Flyte: `run_grpo` over tiers whose methods await
the tasks.

- `train_rl` (driver, `report=True`): `rl.loop.grpo.run_grpo` over `grpo_tiers(...)`, whose methods await the tasks
  of `rl.deploy.flyte.grpo_tasks`; a `flyte.group` per iteration; checkpoint and resume through
  `flyte.ctx().checkpoint`.
- `run_driver` (in `rl.deploy.flyte.grpo_driver`, re-exported here): its body, shared with
  `rl.deploy.flyte.clustered.train_rl_clustered` (another train task, same driver).

Run it: `flyte run rl/deploy/flyte/grpo.py train_rl` (the smoke profile), or `python -m rl.deploy.flyte.grpo --local`
here.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from typing import Any

import flyte

from rl.deploy.flyte.config import PROFILES, GrpoRunConfig, reuse_warning, smoke
from rl.deploy.flyte.envs import REUSE, check_engine_placement, grpo_driver_env
from rl.deploy.flyte.grpo_driver import GrpoRunResult, TrainTask, grpo_tiers, run_driver
from rl.deploy.flyte.grpo_tasks import train_step

__all__ = ["GrpoRunResult", "TrainTask", "grpo_driver_env", "grpo_tiers", "run_driver", "train_rl"]


SMOKE = smoke()


@grpo_driver_env.task(report=True, retries=2)
async def train_rl(config: GrpoRunConfig = SMOKE) -> GrpoRunResult:
    """The GRPO loop: fan out rollouts, score each group as it lands, one train step, checkpoint, report; repeat.

    A retried attempt (after a crash or a preemption) resumes after the last checkpointed iteration with its history;
    a new run starts from iteration 0.
    """
    return await run_driver(config, step_task=train_step, title="GRPO + LoRA")


def main(argv: list[str] | None = None) -> int:
    """`python -m rl.deploy.flyte.grpo [--local] [--profile smoke|stress --base-uri URI]`: run the loop."""
    parser = argparse.ArgumentParser(prog="python -m rl.deploy.flyte.grpo", description=main.__doc__)
    parser.add_argument("--profile", choices=sorted(PROFILES), default="smoke")
    parser.add_argument("--base-uri", default="", help="a prefetched model directory (required by --profile stress)")
    parser.add_argument("--iterations", type=int, default=None)
    parser.add_argument("--clustered", action="store_true", help="run train_rl_clustered (pipelined, DDP trainer)")
    parser.add_argument("--local", action="store_true", help="Flyte's local mode in this process, no cluster")
    args = parser.parse_args(argv)
    config = PROFILES["stress"](args.base_uri) if args.profile == "stress" else PROFILES[args.profile]()
    if args.base_uri and args.profile != "stress":
        config = config.replace(model=replace(config.model, uri=args.base_uri))
    if args.iterations is not None:
        config = config.replace(grpo=replace(config.grpo, iterations=args.iterations))
    task: Any = train_rl
    if args.clustered:
        from rl.deploy.flyte.clustered import train_rl_clustered

        config = config.replace(grpo=replace(config.grpo, pipelined=True))
        task = train_rl_clustered
    check_engine_placement(config.engine.kind)  # vLLM where the tiers deploy no GPU: refused before submitting
    warning = None if args.local else reuse_warning(config, REUSE)
    if warning is not None:  # the GPU tiers' rollout pods, one per group, each downloading the base and starting vLLM
        print(warning, file=sys.stderr)
    if args.local:
        run = flyte.with_runcontext(mode="local").run(task, config=config)
    else:
        flyte.init_from_config()
        run = flyte.run(task, config=config)
    print(run.url)
    if args.local:
        result = run.outputs()[0]
        for row in result.history:
            metrics = "".join(f" {name} {value:.3f}" for name, value in sorted(row.task_metrics.items()))
            print(f"iteration {row.iteration}: mean reward {row.mean_reward:.3f}{metrics}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
