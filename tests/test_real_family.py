"""The real family's layout and precision on the CPU: a Qwen3-shaped model (head_dim 128, the 151,936-token vocabulary,
bfloat16 weights in shards plus their index) loads, trains a step with a bfloat16 base, float32 LoRA, sdpa attention,
gradient checkpointing and micro-batches, and its adapter saves, restores and resumes bit for bit.

A step over the real vocabulary takes seconds on a busy CPU (bfloat16 matmuls into 151,936 logits), so those tests
are `slow`; `unit` trains the same layout and settings on a model whose vocabulary is cut to the tokenizer's."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
from safetensors.torch import load as load_safetensors
from trainer_batches import REAL_FAMILY_TRAINER, make_batch, make_rollouts, varied_rewards

from rl.errors import ModelDirError
from rl.models import load_base_model, load_tokenizer
from rl.models.model_dir import INDEX_FILE, check_model_dir
from rl.models.opened_model import open_model
from rl.models.qwen3 import Qwen3ModelConfig, build_qwen3_model
from rl.storage.artifacts import LocalArtifacts
from rl.trainer.adapter import load_policy
from rl.trainer.config import TrainerConfig
from rl.trainer.peft_trainer import PeftTrainer

T = TypeVar("T")

SHAPE = Qwen3ModelConfig(seed=5)
SMALL_VOCAB = Qwen3ModelConfig(seed=5, vocab_size=64)


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_qwen3_model(tmp_path_factory.mktemp("qwen3") / "model", SHAPE)


@pytest.fixture(scope="module")
def rollouts(qwen3_dir: Path) -> list:
    return make_rollouts(qwen3_dir, groups=2, samples=3, seed=4)


def test_a_sharded_bfloat16_model_initialises_and_trains_an_adapter(tmp_path: Path) -> None:
    """`init_adapter` on shards (it raised ModelDirError for want of one model.safetensors) and one step under the
    real-size settings, on the family's layout with a vocabulary cut to the tokenizer's."""
    model_dir = build_qwen3_model(tmp_path / "model", SMALL_VOCAB, max_shard_size="100KB")
    assert len(list(model_dir.glob("model-*-of-*.safetensors"))) >= 2
    trainer = PeftTrainer(
        open_model(model_dir, tokenizer=False), LocalArtifacts(tmp_path / "artifacts"), REAL_FAMILY_TRAINER
    )
    init = run(trainer.init_adapter(seed=1))
    few = make_rollouts(model_dir, groups=1, samples=3, seed=4)
    result = run(trainer.train_step(make_batch(few, varied_rewards(few), init.adapter, init.optimizer_state)))
    assert result.metrics.contributing == 3 and result.adapter.digest != init.adapter.digest


def test_the_model_has_the_real_layout_and_shape(qwen3_dir: Path) -> None:
    """Several bfloat16 shards named as the hub names them, an index naming every tensor, head_dim 128."""
    shards = sorted(p.name for p in qwen3_dir.glob("model-*-of-*.safetensors"))
    assert len(shards) >= 2 and not (qwen3_dir / "model.safetensors").exists()
    index = json.loads((qwen3_dir / INDEX_FILE).read_text())
    assert sorted(set(index["weight_map"].values())) == shards
    config = json.loads((qwen3_dir / "config.json").read_text())
    assert (config["model_type"], config["head_dim"], config["vocab_size"]) == ("qwen3", 128, 151_936)
    model = load_base_model(open_model(qwen3_dir, tokenizer=False), dtype=torch.bfloat16, attention="sdpa")
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert model.config._attn_implementation == "sdpa"
    assert load_tokenizer(open_model(qwen3_dir, weights=False))("1=")["input_ids"][0] == model.config.bos_token_id


def test_a_model_directory_missing_a_shard_is_refused_in_one_line(qwen3_dir: Path, tmp_path: Path) -> None:
    """An incomplete download fails before loading, saying which shard is missing and what to do."""
    broken = Path(shutil.copytree(qwen3_dir, tmp_path / "broken"))
    victim = sorted(broken.glob("model-*-of-*.safetensors"))[-1]
    victim.unlink()
    with pytest.raises(ModelDirError) as info:
        load_base_model(open_model(broken, tokenizer=False))
    message = str(info.value)
    assert victim.name in message and "\n" not in message and "incomplete" in message


@pytest.mark.parametrize(
    ("damage", "says"),
    [
        (lambda d: (d / INDEX_FILE).write_text("{not json"), "not valid JSON"),
        (lambda d: (d / INDEX_FILE).write_text('{"weight_map": {}}'), "no weight_map"),
        (lambda d: (d / "config.json").unlink(), "lacks config.json"),
        (lambda d: [p.unlink() for p in d.glob("model*.safetensors*")], "no model.safetensors and no"),
    ],
)
def test_a_damaged_model_directory_is_refused_in_one_line(
    qwen3_dir: Path, tmp_path: Path, damage: Any, says: str
) -> None:
    broken = Path(shutil.copytree(qwen3_dir, tmp_path / "broken"))
    damage(broken)
    with pytest.raises(ModelDirError, match=says) as info:
        check_model_dir(broken)
    assert "\n" not in str(info.value)


@pytest.mark.slow
def test_a_bfloat16_sharded_model_trains_with_float32_lora_sdpa_and_checkpointing(
    qwen3_dir: Path, rollouts: list, tmp_path: Path
) -> None:
    """init_adapter and a step on the shards (init_adapter refused a sharded directory before); the adapter and its
    optimizer state are float32, the step moves them, and the restored adapter is what the trainer holds."""
    trainer = PeftTrainer(
        open_model(qwen3_dir, tokenizer=False), LocalArtifacts(tmp_path / "artifacts"), REAL_FAMILY_TRAINER
    )
    init = run(trainer.init_adapter(seed=1))
    v0 = load_safetensors(run(trainer.artifacts.get(init.adapter))["adapter_model.safetensors"])
    assert v0 and {t.dtype for t in v0.values()} == {torch.float32}
    result = run(trainer.train_step(make_batch(rollouts, varied_rewards(rollouts), init.adapter, init.optimizer_state)))
    assert result.metrics.contributing == len(rollouts) and torch.isfinite(torch.tensor(result.metrics.loss))
    v1 = load_safetensors(run(trainer.artifacts.get(result.adapter))["adapter_model.safetensors"])
    assert {t.dtype for t in v1.values()} == {torch.float32}
    assert any(not torch.equal(v0[k], v1[k]) for k in v0)
    warm = trainer._warm
    assert warm is not None
    held = warm.prepared.model
    assert {p.dtype for n, p in held.named_parameters() if not p.requires_grad} == {torch.bfloat16}
    assert held.base_model.model.model.gradient_checkpointing
    restored = load_policy(
        open_model(qwen3_dir, tokenizer=False),
        run(trainer.artifacts.get(result.adapter)),
        trainable=False,
        config=REAL_FAMILY_TRAINER,
    )
    live = {n: p for n, p in held.named_parameters() if p.requires_grad}
    for name, param in restored.named_parameters():
        if "lora_" in name:
            assert param.dtype == torch.float32 and torch.equal(param, live[name]), name


@pytest.mark.slow
def test_a_resumed_run_continues_bit_for_bit(qwen3_dir: Path, rollouts: list, tmp_path: Path) -> None:
    """Step 2 from the artifacts in a fresh trainer (a restarted task) equals step 2 of the trainer that kept going."""
    rewards = varied_rewards(rollouts)
    store = LocalArtifacts(tmp_path / "artifacts")
    first = PeftTrainer(open_model(qwen3_dir, tokenizer=False), store, REAL_FAMILY_TRAINER)
    init = run(first.init_adapter(seed=1))
    v1 = run(first.train_step(make_batch(rollouts, rewards, init.adapter, init.optimizer_state)))
    batch2 = make_batch(rollouts, rewards[::-1], v1.adapter, v1.optimizer_state, step=1, new_version=2)
    kept_going = run(first.train_step(batch2))
    resumed = run(PeftTrainer(open_model(qwen3_dir, tokenizer=False), store, REAL_FAMILY_TRAINER).train_step(batch2))
    assert first.cold_loads == 1
    assert (resumed.adapter.digest, resumed.optimizer_state.digest) == (
        kept_going.adapter.digest,
        kept_going.optimizer_state.digest,
    )


@pytest.mark.slow
def test_checkpointing_changes_memory_not_the_numbers(qwen3_dir: Path, rollouts: list, tmp_path: Path) -> None:
    """The recomputed forward is the same computation: with and without checkpointing a step writes the same bytes.
    Checkpointing refuses a KV cache, so it forwards every sample's prompt: the step without it is asked to as well."""
    plain = TrainerConfig(**{**REAL_FAMILY_TRAINER.__dict__, "gradient_checkpointing": False, "share_prompts": False})
    digests = []
    for config in (REAL_FAMILY_TRAINER, plain):
        trainer = PeftTrainer(
            open_model(qwen3_dir, tokenizer=False),
            LocalArtifacts(tmp_path / str(config.gradient_checkpointing)),
            config,
        )
        init = run(trainer.init_adapter(seed=1))
        step = run(trainer.train_step(make_batch(rollouts, varied_rewards(rollouts), init.adapter, None)))
        digests.append(step.adapter.digest)
    assert digests[0] == digests[1]


def test_a_run_checks_its_model_directory_from_the_listing_before_any_task(tmp_path: Path) -> None:
    """`check_base` (the driver's first step) passes a complete sharded directory and names a missing shard, reading
    only the listing and the JSON files."""
    from flyte.io import Dir

    from rl.deploy.flyte.bindings import check_base

    model_dir = build_qwen3_model(tmp_path / "model", SMALL_VOCAB, max_shard_size="100KB")
    run(check_base(Dir.from_existing_remote(str(model_dir))))
    victim = sorted(model_dir.glob("model-*-of-*.safetensors"))[0]
    victim.unlink()
    with pytest.raises(ModelDirError, match=victim.name):
        run(check_base(Dir.from_existing_remote(str(model_dir))))
    with pytest.raises(ModelDirError, match="does not exist"):
        run(check_base(Dir.from_existing_remote(str(tmp_path / "nowhere"))))
