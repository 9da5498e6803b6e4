"""The GRPO + LoRA loop of the training-loop and rollouts tutorials on Flyte: `run_grpo` over tiers whose methods await
the tasks.

- `train_rl` (driver, `report=True`): `rl.loop.grpo.run_grpo` over `grpo_tiers(...)`, whose methods await the tasks
  of `rl.flyte.grpo_tasks`; a `flyte.group` per iteration; checkpoint and resume through `flyte.ctx().checkpoint`.
- `run_driver`: its body, shared with `rl.flyte.clustered.train_rl_clustered` (another train task, same driver).

Run it: `flyte run rl/flyte/grpo.py train_rl` (the smoke profile), or `python -m rl.flyte.grpo --local` here.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import flyte
from flyte.io import Dir

from rl.flyte.bindings import DirArtifacts, FlyteReporter, check_base, dir_of, ref_of
from rl.flyte.checkpoint_store import CrashAfterCheckpoint, FlyteStateStore
from rl.flyte.config import PROFILES, EngineSpec, FaultSpec, GrpoRunConfig, smoke
from rl.flyte.envs import grpo_driver_env
from rl.flyte.grpo_tasks import (
    TrainInput,
    TrainOutput,
    add_rollouts,
    buffer_ref,
    buffer_version,
    build_base,
    evaluate,
    generate,
    init_adapter,
    score_group,
    train_step,
)
from rl.loop.grpo import GrpoTiers, run_grpo
from rl.problems import constant_baseline_accuracy, problem_set
from rl.protocols import StateStore
from rl.trainer.config import TrainerConfig
from rl.types import ArtifactRef, EvalResult, IterationMetrics, Rollout, RolloutRequest, TrainBatch, TrainResult

__all__ = ["GrpoRunResult", "TrainTask", "grpo_driver_env", "grpo_tiers", "run_driver", "train_rl"]


@dataclass(frozen=True)
class GrpoRunResult:
    """The driver's output: the final adapter and optimizer state, the report's history and the evaluations."""

    adapter: Dir
    optimizer_state: Dir
    adapter_version: int
    history: list[IterationMetrics] = field(default_factory=list)
    evals: list[EvalResult] = field(default_factory=list)
    resumed_from: int = -1
    # The rollout buffer's last version (a Dir of iter-NNNNN.jsonl files) and its content digest; "" when not kept.
    rollouts_uri: str = ""
    rollouts_digest: str = ""


# ------------------------------------------------------------------------------- the tiers, as awaits of the tasks


class TrainTask(Protocol):
    """The call shape of `train_step` and `rl.flyte.clustered.train_step_clustered`."""

    async def __call__(self, base: Dir, adapter: Dir, optimizer_state: Dir, batch: TrainInput) -> TrainOutput: ...


@dataclass(frozen=True)
class _TaskEngine:
    base: Dir
    spec: EngineSpec

    async def generate(self, request: RolloutRequest) -> list[Rollout]:
        return await generate(self.base, dir_of(request.adapter), request, self.spec)


@dataclass(frozen=True)
class _TaskScorer:
    reward: str

    async def score_group(self, rollouts: Any) -> list[float]:
        return await score_group(list(rollouts), self.reward)


@dataclass(frozen=True)
class _TaskTrainer:
    base: Dir
    config: TrainerConfig
    step_task: TrainTask

    async def init_adapter(self, seed: int) -> TrainResult:
        return (await init_adapter(self.base, seed, self.config)).result()

    async def train_step(self, batch: TrainBatch) -> TrainResult:
        optimizer_state = dir_of(batch.optimizer_state) if batch.optimizer_state is not None else Dir.empty()
        out = await self.step_task(self.base, dir_of(batch.adapter), optimizer_state, TrainInput.of(batch, self.config))
        return out.result()


@dataclass(frozen=True)
class _TaskEvaluator:
    base: Dir
    config: GrpoRunConfig

    async def evaluate(self, adapter: ArtifactRef, policy_version: int, k: int, seed: int) -> EvalResult:
        config = self.config
        return await evaluate(
            self.base, dir_of(adapter), policy_version, k, seed, config.problems, config.grpo.max_tokens, config.engine
        )


@dataclass(frozen=True)
class _TaskBuffer:
    async def append(
        self, iteration: int, rollouts: Sequence[Rollout], rewards: Sequence[float], parent: str | None
    ) -> str:
        parent_dir = dir_of(buffer_ref(parent)) if parent is not None else None
        out = await add_rollouts(parent_dir, iteration, list(rollouts), list(rewards))
        return buffer_version(ref_of(out))


def grpo_tiers(config: GrpoRunConfig, base: Dir, *, step_task: TrainTask, title: str) -> GrpoTiers:
    """The driver's tiers: each method awaits a task; artifacts are Dirs; one `flyte.group` per iteration."""
    problems = problem_set(config.problems)
    reporter = FlyteReporter(
        title=title,
        baseline_accuracy=constant_baseline_accuracy(problems.eval_prompts()),
        notes=[
            f"profile {config.profile} · model {config.model.uri or 'tiny (built offline)'} · engine "
            f"{config.engine.kind} · {config.grpo.prompts_per_iteration} prompts x {config.grpo.group_size} samples · "
            f"{'pipelined' if config.grpo.pipelined else 'sequential'}"
        ],
    )
    return GrpoTiers(
        engine=_TaskEngine(base, config.engine),
        scorer=_TaskScorer(config.reward),
        trainer=_TaskTrainer(base, config.trainer, step_task),
        artifacts=DirArtifacts(),
        prompts=problems,
        evaluator=_TaskEvaluator(base, config) if config.grpo.evaluate else None,
        reporter=reporter,
        group=flyte.group,
        buffer=_TaskBuffer() if config.keep_rollouts else None,
        task_metrics=problems.metrics,
    )


async def run_driver(
    config: GrpoRunConfig, *, step_task: TrainTask, title: str, faults: FaultSpec | None = None
) -> GrpoRunResult:
    """The body of every GRPO driver task: resolve the base model, bind the tiers, run (or resume) `run_grpo`. `faults`
    (the failure-injected drivers of `rl.flyte.grpo_faults` only) wraps the checkpoint store to crash once."""
    config.check()  # a config made without validation (`model_construct`) still fails before the first task
    if faults is not None:
        config.check_faults(faults)
    base = Dir.from_existing_remote(config.model.uri) if config.model.uri else await build_base(config.model.tiny)
    await check_base(base)  # every profile's model, prefetched or built: one line now, not a dead GPU task later
    ctx = flyte.ctx()
    store: StateStore = FlyteStateStore(ctx.checkpoint if ctx is not None else None)
    if faults is not None and faults.crash_after_iteration >= 0:
        store = CrashAfterCheckpoint(store, faults.crash_after_iteration, faults.crash_marker)
    outcome = await run_grpo(config.grpo, grpo_tiers(config, base, step_task=step_task, title=title), store)
    rollouts = buffer_ref(outcome.buffer_version) if outcome.buffer_version else ArtifactRef("", "")
    return GrpoRunResult(
        adapter=dir_of(outcome.adapter),
        optimizer_state=dir_of(outcome.optimizer_state),
        adapter_version=outcome.adapter_version,
        history=list(outcome.history),
        evals=list(outcome.evals),
        resumed_from=outcome.resumed_from,
        rollouts_uri=rollouts.uri,
        rollouts_digest=rollouts.digest,
    )


SMOKE = smoke()


@grpo_driver_env.task(report=True, retries=2)
async def train_rl(config: GrpoRunConfig = SMOKE) -> GrpoRunResult:
    """The GRPO loop: fan out rollouts, score each group as it lands, one train step, checkpoint, report; repeat.

    A retried attempt (after a crash or a preemption) resumes after the last checkpointed iteration with its history;
    a new run starts from iteration 0.
    """
    return await run_driver(config, step_task=train_step, title="GRPO + LoRA")


def main(argv: list[str] | None = None) -> int:
    """`python -m rl.flyte.grpo [--local] [--profile smoke|stress --base-uri URI]`: run the loop."""
    parser = argparse.ArgumentParser(prog="python -m rl.flyte.grpo", description=main.__doc__)
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
        from rl.flyte.clustered import train_rl_clustered

        config = config.replace(grpo=replace(config.grpo, pipelined=True))
        task = train_rl_clustered
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
