"""The GRPO driver on the real CPU stack is deterministic: same seeds and pinned threads give the same bits."""

from __future__ import annotations

import asyncio

import pytest

from rl.local import local_grpo
from rl.loop.grpo import GrpoConfig, run_grpo

CONFIG = GrpoConfig(iterations=3, prompts_per_iteration=2, group_size=4, seed=11, max_tokens=3, eval_k=2)


def _run(out):
    deployment = local_grpo(out, CONFIG, buffer=False, report_interval_s=1e9)
    return asyncio.run(run_grpo(CONFIG, deployment.tiers, deployment.store))


@pytest.fixture(scope="module")
def first(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("first"))


def test_two_three_iteration_runs_with_pinned_threads_give_bitwise_identical_adapters(first, tmp_path):
    """Two 3-iteration runs with the thread count pinned end with the same adapter, optimizer state and history."""
    second = _run(tmp_path / "b")
    assert first.adapter.digest == second.adapter.digest
    assert first.optimizer_state.digest == second.optimizer_state.digest
    assert first.history == second.history and first.evals == second.evals
    assert [row.adapter_version for row in first.history] == [1, 2, 3]


def test_a_different_run_seed_gives_a_different_adapter(first, tmp_path):
    """The equality above is not vacuous: another seed samples other rollouts and trains another adapter."""
    from dataclasses import replace

    other_config = replace(CONFIG, seed=12)
    deployment = local_grpo(tmp_path / "b", other_config, buffer=False, report_interval_s=1e9)
    other = asyncio.run(run_grpo(other_config, deployment.tiers, deployment.store))
    assert other.adapter.digest != first.adapter.digest
