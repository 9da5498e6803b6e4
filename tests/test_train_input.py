"""The train tasks' one input type (`TrainInput`): it carries a TrainBatch across the task boundary intact, and
Flyte serialises it; the artifacts cross beside it as top-level Dirs, where Flyte keys the cache on their digest."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest
from flyte.io import Dir
from flyte.types import TypeEngine
from hypothesis import given, settings
from hypothesis import strategies as st

from rl.deploy.flyte.grpo_tasks import TrainInput
from rl.trainer.config import TrainerConfig
from rl.types import ArtifactRef, Rollout, TrainBatch


def _rollouts(data: st.DataObject) -> list[Rollout]:
    n = data.draw(st.integers(1, 4), label="rollouts")
    return [
        Rollout(
            group_id=data.draw(st.integers(0, 3)),
            question="3=",
            answer="4",
            completion=data.draw(st.text(max_size=4)),
            prompt_token_ids=[3],
            token_ids=[4, 5],
            logprobs=[-0.5, data.draw(st.floats(-5.0, 0.0))],
            policy_version=data.draw(st.integers(0, 3)),
            seed=data.draw(st.integers(0, 2**31)),
        )
        for _ in range(n)
    ]


@pytest.mark.heavy
@settings(max_examples=25, deadline=None)
@given(st.data())
def test_a_batch_crosses_the_train_task_boundary_intact(data):
    rollouts = _rollouts(data)
    rewards = [data.draw(st.floats(-1.0, 1.0)) for _ in rollouts]
    adapter = ArtifactRef("file:///a", "d1")
    optimizer = data.draw(st.sampled_from([None, ArtifactRef("file:///o", "d2")]))
    batch = TrainBatch(
        data.draw(st.integers(0, 9)), rollouts, rewards, adapter, optimizer, data.draw(st.integers(1, 9))
    )
    trainer = TrainerConfig(lora_rank=data.draw(st.sampled_from([2, 4, 8])))
    crossing = TrainInput.of(batch, trainer)
    assert crossing.batch(adapter, optimizer) == batch and crossing.trainer == trainer

    async def round_trip() -> TrainInput:
        literal_type = TypeEngine.to_literal_type(TrainInput)
        literal = await TypeEngine.to_literal(crossing, TrainInput, literal_type)
        return await TypeEngine.to_python_value(literal, TrainInput)

    assert asyncio.run(round_trip()) == crossing


def test_a_top_level_dir_is_keyed_by_its_digest_not_its_path():
    """Why the adapter and optimizer state are not fields of TrainInput: only a top-level Dir literal carries the
    content digest the task cache keys on; a Dir inside a dataclass is keyed by its path."""

    async def literal_hash(path: str) -> str:
        d = Dir.from_existing_remote(path, dir_cache_key="digest")
        return (await TypeEngine.to_literal(d, Dir, TypeEngine.to_literal_type(Dir))).hash

    assert asyncio.run(literal_hash("file:///one")) == asyncio.run(literal_hash("file:///two")) == "digest"

    async def nested_literals() -> list[object]:
        literal_type = TypeEngine.to_literal_type(_WithDir)
        return [
            await TypeEngine.to_literal(
                _WithDir(Dir.from_existing_remote(p, dir_cache_key="digest")), _WithDir, literal_type
            )
            for p in ("file:///one", "file:///two")
        ]

    one, two = asyncio.run(nested_literals())
    # If this fails, Flyte now keys a nested Dir by its digest: the Dirs may then move into TrainInput.
    assert one.hash == two.hash == "" and one != two


@dataclass(frozen=True)
class _WithDir:
    adapter: Dir
