"""The GRPO driver's `span` hook (the `flyte.group` role): every action of an iteration runs inside `iter-<N>`.

The Flyte binding (`rl.deploy.flyte.grpo`) passes `flyte.group` as `GrpoTiers.span`; these tests pin which group each
tier call sees, sequential and pipelined, with a context variable standing in for Flyte's task context.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest
from span_support import CURRENT, recording_span

from rl.deploy.simulated.artifacts import MemoryArtifacts
from rl.deploy.simulated.grpo_tiers import MemoryEngine, MemoryEvaluator, MemoryScorer, MemoryTrainer
from rl.loop.grpo import GrpoConfig, GrpoTiers, run_grpo
from rl.problems import DigitSuccessor
from rl.seeding import rollout_seed
from rl.storage.checkpoint.memory_store import MemoryCheckpointStore
from rl.types import ArtifactRef, EvalResult, RolloutRequest, TrainBatch, TrainResult

CONFIG = GrpoConfig(iterations=3, prompts_per_iteration=2, group_size=2, seed=5, eval_k=2)


class _Seen:
    def __init__(self) -> None:
        self.calls: list[tuple[str, object, str | None]] = []


class _Engine(MemoryEngine):
    def __init__(self, artifacts: MemoryArtifacts, seen: _Seen) -> None:
        super().__init__(artifacts)
        self.seen = seen

    async def generate(self, request: RolloutRequest):
        self.seen.calls.append(("generate", request.seed, CURRENT.get()))
        return await super().generate(request)


class _Trainer(MemoryTrainer):
    def __init__(self, artifacts: MemoryArtifacts, seen: _Seen) -> None:
        super().__init__(artifacts)
        self.seen = seen

    async def train_step(self, batch: TrainBatch) -> TrainResult:
        self.seen.calls.append(("train", batch.step, CURRENT.get()))
        return await super().train_step(batch)


class _Evaluator(MemoryEvaluator):
    def __init__(self, artifacts: MemoryArtifacts, seen: _Seen) -> None:
        super().__init__(artifacts, DigitSuccessor().eval_prompts())
        self.seen = seen

    async def evaluate(self, adapter: ArtifactRef, policy_version: int, k: int, seed: int) -> EvalResult:
        self.seen.calls.append(("evaluate", policy_version, CURRENT.get()))
        return await super().evaluate(adapter, policy_version, k, seed)


def _run(config: GrpoConfig, *, spanned: bool = True) -> _Seen:
    seen = _Seen()
    artifacts = MemoryArtifacts()
    tiers = GrpoTiers(
        engine=_Engine(artifacts, seen),
        scorer=MemoryScorer(),
        trainer=_Trainer(artifacts, seen),
        artifacts=artifacts,
        prompts=DigitSuccessor(),
        evaluator=_Evaluator(artifacts, seen),
        span=recording_span if spanned else None,
    )
    asyncio.run(run_grpo(config, tiers, MemoryCheckpointStore()))
    return seen


def _iteration_of(config: GrpoConfig, seed: object) -> int:
    return next(
        it
        for it in range(config.iterations)
        for gid in range(config.prompts_per_iteration)
        if rollout_seed(config.seed, it, gid) == seed
    )


@pytest.mark.parametrize("pipelined", [False, True])
def test_every_rollout_and_train_step_runs_inside_its_iterations_group(pipelined):
    """The training-loop tutorial: "flyte.group(f"iter-{it}") collects an iteration's rollout, reward, and train
    actions"."""
    config = replace(CONFIG, pipelined=pipelined)
    seen = _run(config)
    generates = [(seed, group) for kind, seed, group in seen.calls if kind == "generate"]
    trains = [(step, group) for kind, step, group in seen.calls if kind == "train"]
    assert len(generates) == config.iterations * config.prompts_per_iteration
    assert all(group == f"iter-{_iteration_of(config, seed)}" for seed, group in generates)
    assert trains == [(it, f"iter-{it}") for it in range(config.iterations)]


def test_each_evaluation_runs_in_a_group_named_for_the_version_it_scores():
    """Evaluation runs off the critical path, so it gets its own group rather than borrowing an iteration's."""
    seen = _run(CONFIG)
    evaluations = [(version, group) for kind, version, group in seen.calls if kind == "evaluate"]
    assert evaluations == [(v, f"eval-v{v}") for v in range(1, CONFIG.iterations + 1)]


def test_without_a_span_binding_the_driver_opens_none():
    """The hook is optional: the in-memory tiers and the local stack run exactly as before."""
    seen = _run(CONFIG, spanned=False)
    assert {group for _, _, group in seen.calls} == {None}
