"""The body of every GRPO driver task on Flyte: `run_driver` binds `rl.loop.grpo.run_grpo` to tiers whose methods await
the tasks of `rl.deploy.flyte.grpo_tasks` (`grpo_tiers`), and returns a `GrpoRunResult`.

`rl.deploy.flyte.grpo.train_rl` and `rl.deploy.flyte.clustered.train_rl_clustered` are two driver tasks around it (the
second with the DDP trainer), and `rl.deploy.flyte.grpo_faults`' failure-injected twins a third; none of them imports
another.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import flyte
from flyte.io import Dir

from rl.deploy.flyte.bindings import DirArtifacts, FlyteReporter, check_base, dir_of, ref_of
from rl.deploy.flyte.cached_outputs import call_cached
from rl.deploy.flyte.checkpoint_store import CrashAfterCheckpoint, FlyteCheckpointStore
from rl.deploy.flyte.config import FaultSpec, GrpoRunConfig
from rl.deploy.flyte.grpo_tasks import (
    RolloutTier,
    TrainInput,
    TrainOutput,
    add_rollouts,
    buffer_ref,
    buffer_version,
    build_base,
    init_adapter,
    rollout_tier,
    score_group,
)
from rl.loop.grpo import GrpoTiers, run_grpo
from rl.problems import constant_baseline_accuracy, problem_set
from rl.protocols import CheckpointStore
from rl.trainer.config import TrainerConfig
from rl.types import ArtifactRef, EvalResult, IterationMetrics, Rollout, TrainBatch, TrainResult

__all__ = ["GrpoRunResult", "TrainTask", "grpo_tiers", "run_driver"]


@dataclass(frozen=True)
class GrpoRunResult:
    """The driver's output: the final adapter and optimizer state, the report's history and the evaluations."""

    adapter: Dir
    optimizer_state: Dir
    policy_version: int
    history: list[IterationMetrics] = field(default_factory=list)
    evals: list[EvalResult] = field(default_factory=list)
    resumed_from: int = -1
    # The rollout buffer's last version (a Dir of iter-NNNNN.jsonl files) and its content digest; "" when not kept.
    rollouts_uri: str = ""
    rollouts_digest: str = ""


# ------------------------------------------------------------------------------- the tiers, as awaits of the tasks


class TrainTask(Protocol):
    """The call shape of `train_step` and `rl.deploy.flyte.clustered.train_step_clustered`: Flyte tasks, whose `name`,
    `cache` and `override` `call_cached` uses too."""

    async def __call__(self, base: Dir, adapter: Dir, optimizer_state: Dir, batch: TrainInput) -> TrainOutput: ...


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
        return (await call_cached(init_adapter, self.base, seed, self.config, names=_written)).result()

    async def train_step(self, batch: TrainBatch) -> TrainResult:
        optimizer_state = dir_of(batch.optimizer_state) if batch.optimizer_state is not None else Dir.empty()
        step_input = TrainInput.of(batch, self.config)
        out = await call_cached(
            self.step_task, self.base, dir_of(batch.adapter), optimizer_state, step_input, names=_written
        )
        return out.result()


def _written(out: TrainOutput) -> list[str]:
    return [out.adapter.path, out.optimizer_state.path]


@dataclass(frozen=True)
class _TaskEvaluator:
    rollouts: RolloutTier  # the evaluate task of the engine's own pod
    config: GrpoRunConfig

    async def evaluate(self, adapter: ArtifactRef, policy_version: int, k: int, seed: int) -> EvalResult:
        config = self.config
        return await self.rollouts.evaluate(adapter, policy_version, k, seed, config.problems, config.grpo.max_tokens)


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
    rollouts = rollout_tier(base, config.engine)  # refuses an engine these tiers have no pod for
    return GrpoTiers(
        engine=rollouts,
        scorer=_TaskScorer(config.reward),
        trainer=_TaskTrainer(base, config.trainer, step_task),
        artifacts=DirArtifacts(),
        prompts=problems,
        evaluator=_TaskEvaluator(rollouts, config) if config.grpo.evaluate else None,
        reporter=reporter,
        span=flyte.group,
        buffer=_TaskBuffer() if config.keep_rollouts else None,
        task_metrics=problems.metrics,
    )


async def run_driver(
    config: GrpoRunConfig, *, step_task: TrainTask, title: str, faults: FaultSpec | None = None
) -> GrpoRunResult:
    """The body of every GRPO driver task: resolve the base model, bind the tiers, run (or resume) `run_grpo`. `faults`
    (the failure-injected drivers of `rl.deploy.flyte.grpo_faults` only) wraps the checkpoint store to crash once."""
    config.check()  # a config made without validation (`model_construct`) still fails before the first task
    if faults is not None:
        config.check_faults(faults)
    if config.model.uri:
        base = Dir.from_existing_remote(config.model.uri)
    else:
        base = await call_cached(build_base, config.model.tiny, names=lambda built: [built.path])
    await check_base(base)  # every profile's model, prefetched or built: one line now, not a dead GPU task later
    ctx = flyte.ctx()
    store: CheckpointStore = FlyteCheckpointStore(ctx.checkpoint if ctx is not None else None)
    if faults is not None and faults.crash_after_iteration >= 0:
        store = CrashAfterCheckpoint(store, faults.crash_after_iteration, faults.crash_marker)
    outcome = await run_grpo(config.grpo, grpo_tiers(config, base, step_task=step_task, title=title), store)
    rollouts = buffer_ref(outcome.buffer_version) if outcome.buffer_version else ArtifactRef("", "")
    return GrpoRunResult(
        adapter=dir_of(outcome.adapter),
        optimizer_state=dir_of(outcome.optimizer_state),
        policy_version=outcome.policy_version,
        history=list(outcome.history),
        evals=list(outcome.evals),
        resumed_from=outcome.resumed_from,
        rollouts_uri=rollouts.uri,
        rollouts_digest=rollouts.digest,
    )
