"""A one-rank DDP step is the single-process step (it once ran one forward per sample whatever the config said).

One rank in this process (a one-rank gloo group): its shard is the whole batch, so a step of `ddp_train_step` is the
single-process step's computation, bit for bit; the per-sample reference (`loss_reference`) differs in its last bits.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from fixtures_real import one_rank_group, tiny_model_dir
from loss_reference import reference_step
from trainer_batches import REAL_FAMILY_TRAINER, make_batch, make_rollouts, varied_rewards

from rl.models.opened_model import open_model
from rl.storage.artifacts import LocalArtifacts
from rl.trainer.config import TrainerConfig
from rl.trainer.ddp import ddp_train_step
from rl.trainer.peft_trainer import PeftTrainer

__all__ = ["one_rank_group", "tiny_model_dir"]

CONFIG = TrainerConfig(lora_rank=4, lora_alpha=8, seed=3, threads=1, micro_batch_size=4)


@pytest.mark.heavy
def test_a_ddp_step_runs_the_single_process_steps_loss(
    tiny_model_dir: Path, tmp_path: Path, one_rank_group: None
) -> None:
    store = LocalArtifacts(tmp_path / "artifacts")
    init = asyncio.run(PeftTrainer(open_model(tiny_model_dir), store, CONFIG).init_adapter(seed=2))
    rollouts = make_rollouts(tiny_model_dir, groups=3, samples=4, seed=5)
    batch = make_batch(rollouts, varied_rewards(rollouts), init.adapter, init.optimizer_state)
    ddp = ddp_train_step(0, 1, tiny_model_dir, tmp_path / "artifacts", batch, CONFIG)
    same = asyncio.run(PeftTrainer(open_model(tiny_model_dir), store, CONFIG).train_step(batch))
    inputs = asyncio.run(store.get(init.adapter)), asyncio.run(store.get(init.optimizer_state))
    different, _ = reference_step(tiny_model_dir, batch, CONFIG, *inputs)
    assert ddp.adapter.digest == same.adapter.digest
    assert ddp.metrics == same.metrics
    assert asyncio.run(store.get(same.adapter)) != different  # the comparison tells the paths apart by their bits


def test_the_clustered_step_trains_the_real_familys_layout_as_one_process_does(
    tmp_path: Path, one_rank_group: None
) -> None:
    """Sharded bfloat16 Qwen3 weights, float32 LoRA, sdpa, checkpointing, micro-batches: the DDP step (one rank) loads
    them and writes what the single-process step writes."""
    from rl.models.qwen3 import Qwen3ModelConfig, build_qwen3_model

    model_dir = build_qwen3_model(tmp_path / "model", Qwen3ModelConfig(seed=5, vocab_size=64), max_shard_size="100KB")
    config = REAL_FAMILY_TRAINER
    store = LocalArtifacts(tmp_path / "artifacts")
    init = asyncio.run(PeftTrainer(open_model(model_dir, tokenizer=False), store, config).init_adapter(seed=1))
    rollouts = make_rollouts(model_dir, groups=1, samples=3, seed=4)
    batch = make_batch(rollouts, varied_rewards(rollouts), init.adapter, init.optimizer_state)
    ddp = ddp_train_step(0, 1, model_dir, tmp_path / "artifacts", batch, config)
    single = asyncio.run(PeftTrainer(open_model(model_dir, tokenizer=False), store, config).train_step(batch))
    assert (ddp.adapter.digest, ddp.metrics) == (single.adapter.digest, single.metrics)
