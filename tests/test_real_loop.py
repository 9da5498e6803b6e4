"""The GRPO driver on the real CPU stack is deterministic: same seeds and pinned threads give the same bits."""

from __future__ import annotations

import asyncio

import pytest

from rl.deploy.local import local_grpo
from rl.loop.grpo import GrpoConfig, run_grpo
from rl.storage.run_dir import open_run

CONFIG = GrpoConfig(iterations=3, prompts_per_iteration=2, group_size=4, seed=11, max_tokens=3, eval_k=2)


def _run(out):
    with open_run(out, command="test") as run:
        deployment = local_grpo(run, CONFIG, buffer=False, report_interval_s=1e9)
        return asyncio.run(run_grpo(CONFIG, deployment.tiers, deployment.store))


@pytest.fixture(scope="module")
def first(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("first"))


@pytest.mark.heavy
def test_two_three_iteration_runs_with_pinned_threads_give_bitwise_identical_adapters(first, tmp_path):
    """Two 3-iteration runs with the thread count pinned end with the same adapter, optimizer state and history."""
    second = _run(tmp_path / "b")
    assert first.adapter.digest == second.adapter.digest
    assert first.optimizer_state.digest == second.optimizer_state.digest
    assert first.history == second.history and first.evals == second.evals
    assert [row.policy_version for row in first.history] == [1, 2, 3]


@pytest.mark.heavy
def test_a_different_run_seed_gives_a_different_adapter(first, tmp_path):
    """The equality above is not vacuous: another seed samples other rollouts and trains another adapter."""
    from dataclasses import replace

    other_config = replace(CONFIG, seed=12)
    with open_run(tmp_path / "b", command="test") as run:
        deployment = local_grpo(run, other_config, buffer=False, report_interval_s=1e9)
        other = asyncio.run(run_grpo(other_config, deployment.tiers, deployment.store))
    assert other.adapter.digest != first.adapter.digest


class _RecordingTrainer:
    def __init__(self, inner) -> None:  # type: ignore[no-untyped-def]
        self.inner, self.steps = inner, []

    async def init_adapter(self, seed):  # type: ignore[no-untyped-def]
        return await self.inner.init_adapter(seed)

    async def train_step(self, batch):  # type: ignore[no-untyped-def]
        result = await self.inner.train_step(batch)
        self.steps.append(result.metrics)
        return result


@pytest.mark.heavy
def test_each_rows_kl_and_clip_fraction_are_the_peft_steps_own(tmp_path):
    """Pipelined on the real stack (stale samples, a moving adapter), each row's KL to the base, clip fraction and
    gradient norm are exactly what that iteration's PEFT step computed from `rl.algorithm.loss`, and they are not all
    zero."""
    from dataclasses import replace

    config = GrpoConfig(iterations=4, prompts_per_iteration=4, group_size=8, seed=1, max_tokens=3, evaluate=False)
    config = replace(config, pipelined=True)
    with open_run(tmp_path, command="test") as run:
        deployment = local_grpo(run, config, buffer=False, report_interval_s=1e9)
        trainer = _RecordingTrainer(deployment.tiers.trainer)
        outcome = asyncio.run(run_grpo(config, replace(deployment.tiers, trainer=trainer), deployment.store))
    rows = [(row.kl, row.clip_frac, row.grad_norm) for row in outcome.history]
    assert rows == [(m.kl, m.clip_frac, m.grad_norm) for m in trainer.steps]
    assert max(kl for kl, _, _ in rows) > 0.0 and max(clip for _, clip, _ in rows) > 0.0
