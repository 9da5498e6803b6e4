"""The real family's layout through the real engine: a Qwen3-shaped model (head dim 128, a 151,936-token vocabulary,
untied embeddings, bfloat16 weights in safetensors shards plus their index, as Qwen3-8B ships; `rl.models.qwen3`) served
by vLLM's CPU build with a LoRA adapter in the trainer's layout. Both sides upcast the same bfloat16 weights to float32,
so the recorded log-probs must equal the trainer's teacher-forced ones within `LOGPROB_MAX_ABS_TOL`, as on the demo's
vLLM model."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from gpu_helpers import logprob_gaps, random_adapter, summarize, trainer_policy
from vllm_cpu_helpers import LOGPROB_MAX_ABS_TOL, generate, request

from rl.models.opened_model import open_model


@pytest.mark.lifetime  # starts and closes an engine of its own
def test_a_sharded_bf16_qwen3_directory_rolls_out_on_real_vllm_with_the_trainers_adapter(
    tmp_path: Path, record_property: Any
) -> None:
    """vLLM loads the sharded layout the trainer loads, serves the trainer-layout adapter on it, and records the
    log-probs the trainer computes for the same tokens."""
    import torch

    from rl.gpu import vllm_cpu_llm_kwargs
    from rl.models import load_tokenizer
    from rl.models.qwen3 import build_qwen3_model
    from rl.samplers.vllm import VLLMEngine
    from rl.storage.artifacts import LocalArtifacts

    model_dir = build_qwen3_model(tmp_path / "qwen3")
    shards = sorted(model_dir.glob("model-*-of-*.safetensors"))
    assert len(shards) > 1 and (model_dir / "model.safetensors.index.json").is_file(), shards
    assert not (model_dir / "model.safetensors").exists()

    store = LocalArtifacts(tmp_path / "artifacts")
    files = random_adapter(model_dir, seed=5)
    ref = asyncio.run(store.put(files, name="qwen3-adapter"))
    policy = trainer_policy(model_dir, files, torch.device("cpu"))

    base = open_model(model_dir)
    engine = VLLMEngine(base, store, llm_kwargs=vllm_cpu_llm_kwargs(), tokenizer=load_tokenizer(base))
    try:
        groups = generate(engine, *(request(ref, seed=70 + g, prompt=g, group=g, max_tokens=8) for g in range(2)))
    finally:
        engine.close()
    gaps = summarize(logprob_gaps([r for group in groups for r in group], policy))
    line = f"mean |Δ| {gaps.mean:.2e}, max |Δ| {gaps.max:.2e} over {gaps.tokens} tokens"
    record_property("qwen3_logprob_gap", line)
    print(f"Qwen3 layout, vLLM (CPU, float32 from bf16 shards) vs trainer log-probs: {line}")
    assert gaps.max <= LOGPROB_MAX_ABS_TOL, str(gaps)
