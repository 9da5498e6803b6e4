"""What the driver writes into each iteration's row: the trainer's statistics, the task's own metrics, completion
lengths, no-signal groups, one drawn sample, and phase seconds on the event loop's (virtual) clock."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from rl.algorithm.advantages import no_signal_groups
from rl.deploy.simulated.artifacts import MemoryArtifacts
from rl.deploy.simulated.grpo_sim import Latencies, grpo_sim
from rl.deploy.simulated.grpo_tiers import LatencyModel, MemoryEngine, MemoryScorer, MemoryTrainer
from rl.loop.grpo import GrpoConfig, GrpoTiers, run_grpo
from rl.problems import DigitSuccessor, accuracy
from rl.storage.checkpoint.memory_store import MemoryCheckpointStore
from rl.types import IterationMetrics, TrainBatch, TrainResult

CONFIG = GrpoConfig(iterations=3, prompts_per_iteration=4, group_size=4, seed=5)


class _StatsTrainer:
    """The in-memory trainer, reporting made-up KL, clip fraction and gradient norm that differ per step."""

    def __init__(self, inner: MemoryTrainer) -> None:
        self.inner = inner

    async def init_adapter(self, seed: int) -> TrainResult:
        return await self.inner.init_adapter(seed)

    async def train_step(self, batch: TrainBatch) -> TrainResult:
        result = await self.inner.train_step(batch)
        stats = replace(result.metrics, kl=0.01 * (batch.step + 1), clip_frac=0.125 * batch.step, grad_norm=2.0)
        return replace(result, metrics=stats)


def _tiers(artifacts: MemoryArtifacts, **changes: object) -> GrpoTiers:
    tiers = GrpoTiers(
        engine=MemoryEngine(artifacts),
        scorer=MemoryScorer(),
        trainer=_StatsTrainer(MemoryTrainer(artifacts)),
        artifacts=artifacts,
        prompts=DigitSuccessor(),
    )
    return replace(tiers, **changes)  # type: ignore[arg-type]


def _run(tiers: GrpoTiers, config: GrpoConfig = CONFIG):
    return asyncio.run(run_grpo(config, tiers, MemoryCheckpointStore()))


def test_each_row_carries_the_train_steps_kl_clip_fraction_and_gradient_norm():
    """The row's kl, clip_frac and grad_norm are the StepMetrics the trainer returned for that iteration's step."""
    history = _run(_tiers(MemoryArtifacts())).history
    assert [row.kl for row in history] == [0.01, 0.02, 0.03]
    assert [row.clip_frac for row in history] == [0.0, 0.125, 0.25]
    assert [row.grad_norm for row in history] == [2.0, 2.0, 2.0]


def test_a_run_without_a_task_metrics_hook_has_no_task_metrics():
    """The driver knows no task: without `task_metrics` no row claims an accuracy or a format rate."""
    assert all(row.task_metrics == {} for row in _run(_tiers(MemoryArtifacts())).history)


def test_task_metrics_are_what_the_hook_returns_for_the_iterations_rollouts_and_rewards():
    """The hook sees each iteration's rollouts with their rewards, and its dict becomes the row's task_metrics."""
    calls: list[tuple[list[str], list[float]]] = []

    def hook(rollouts, rewards):  # type: ignore[no-untyped-def]
        calls.append(([r.completion for r in rollouts], list(rewards)))
        return {"accuracy": accuracy(rollouts), "mean_of_rewards": sum(rewards) / len(rewards)}

    history = _run(_tiers(MemoryArtifacts(), task_metrics=hook)).history
    assert len(calls) == CONFIG.iterations
    for row, (completions, rewards) in zip(history, calls, strict=True):
        assert len(completions) == len(rewards) == row.num_rollouts
        assert row.task_metrics["mean_of_rewards"] == pytest.approx(row.mean_reward)
        assert set(row.task_metrics) == {"accuracy", "mean_of_rewards"}


def test_digit_task_defines_accuracy_and_no_format_rate():
    """The digit task's answer is a bare digit: its metrics are accuracy alone, however the completions look."""
    artifacts = MemoryArtifacts()
    history = _run(_tiers(artifacts, task_metrics=DigitSuccessor().metrics)).history
    assert all(set(row.task_metrics) == {"accuracy"} for row in history)


def test_rows_count_groups_no_signal_groups_and_completion_tokens_and_keep_the_first_rollout_as_sample():
    """num_groups, no_signal_groups and the completion lengths describe the batch the step trained on; the sample is
    the batch's first rollout (group 0, as drawn) with its own reward, not the batch's best."""
    batches: list[tuple[list, list[float]]] = []

    def keep(rollouts, rewards):  # type: ignore[no-untyped-def]
        batches.append((list(rollouts), list(rewards)))
        return {}

    history = _run(_tiers(MemoryArtifacts(), task_metrics=keep)).history
    for row, (rollouts, rewards) in zip(history, batches, strict=True):
        assert row.num_groups == CONFIG.prompts_per_iteration
        assert row.no_signal_groups == len(no_signal_groups([r.group_id for r in rollouts], rewards))
        assert row.mean_completion_tokens == 1.0 and row.max_completion_tokens == 1  # the engine answers one token
        assert (row.sample_question, row.sample_completion, row.sample_reward) == (
            rollouts[0].question,
            rollouts[0].completion,
            rewards[0],
        )
    assert any(row.sample_reward < row.max_reward for row in history)  # so the sample is not simply the best


def test_phase_seconds_are_measured_on_the_event_loops_virtual_clock():
    """On the simulator every phase takes exactly its virtual latency: groups of 4 take 30 + 4 x 1 s and land
    together, the last group's scoring adds 2 s, a step of 16 samples 20 + 16 x 0.5 s, an evaluation 10 s."""
    latencies = Latencies(
        generate=LatencyModel(base_s=30.0, per_item_s=1.0),
        score=LatencyModel(base_s=2.0),
        train=LatencyModel(base_s=20.0, per_item_s=0.5),
        evaluate=LatencyModel(base_s=10.0),
    )
    result = grpo_sim(CONFIG, seed=0, latencies=latencies).run()
    assert result.ok, result.error
    for row in result.output.history:
        assert row.phase_s == pytest.approx({"generate": 34.0, "score": 2.0, "train": 28.0, "evaluate": 10.0})


def test_a_resumed_runs_rows_equal_the_uninterrupted_runs_though_its_phase_seconds_differ():
    """Killed mid-run, the resumed driver replays finished actions in no virtual time, so some phase took less; every
    other field matches bit for bit, which is why `phase_s` is left out of a row's equality."""
    reference = grpo_sim(CONFIG, seed=0).run().output
    differing = 0
    for crash_at in range(4, 24, 3):
        resumed = grpo_sim(CONFIG, seed=0).run(retries=1, crash_at=crash_at)
        assert resumed.ok and resumed.crashes == 1, resumed.error
        assert resumed.output.history == reference.history
        for mine, theirs in zip(resumed.output.history, reference.history, strict=True):
            assert {**mine.to_dict(), "phase_s": None} == {**theirs.to_dict(), "phase_s": None}
            differing += mine.phase_s != theirs.phase_s
    assert differing > 0


def test_rows_written_before_task_metrics_existed_load_with_their_accuracy_and_format_rate_as_task_metrics():
    """A checkpoint or metrics.jsonl of the previous release (top-level accuracy and format_rate) still loads."""
    legacy = {
        "iteration": 0,
        "adapter_version": 1,
        "num_rollouts": 4,
        "mean_reward": 0.5,
        "max_reward": 1.0,
        "accuracy": 0.25,
        "format_rate": 0.0,
        "mean_loss": 0.1,
        "contributing": 4,
        "sample_question": "1=",
        "sample_completion": "2",
        "sample_reward": 1.0,
        "no_signal_groups": 0,
        "max_staleness": 0,
        "extra": {},
    }
    row = IterationMetrics.from_dict(legacy)
    assert row.task_metrics == {"accuracy": 0.25, "format_rate": 0.0}
    assert IterationMetrics.from_dict(row.to_dict()) == row
