"""SmolLM2-135M-Instruct (the pinned real model, `rl.models.pretrained`) served by vLLM's CPU build as
`rl demo grpo --model smollm2 --engine vllm` serves it: its chat template, its end-of-turn token, float32, a LoRA
adapter of the demo's shape. vLLM's recorded log-probs equal the trainer's teacher-forced ones on the same sampled
tokens, at a real model's logit scale (|logits| up to ~40)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from gpu_helpers import logprob_gaps, summarize, trainer_policy

from rl.models.opened_model import open_model
from rl.types import RolloutRequest

# float32 on both sides, as the tiny model's LOGPROB_MAX_ABS_TOL, but at logits of |40| over 30 layers: float32
# carries ~40 * 2**-24 ~ 2.4e-6 of rounding per operation, and vLLM's kernels sum in another order than PEFT's
# unmerged forward. Measured: mean 5.1e-6, max 2.4e-5 over 171 tokens (docs/vllm-cpu.md). The adapter left out moves
# them by 0.07 on average (checked below), 700x over the mean bound: the bounds tell rounding from a wrong policy.
MEAN_BOUND = 1e-4
MAX_BOUND = 1e-3
PROMPTS, SAMPLES, MAX_TOKENS = 4, 4, 12


@pytest.fixture(scope="module")
def smollm2() -> Path:
    from rl.models.pretrained import SMOLLM2, pinned_model

    return pinned_model(SMOLLM2)


@pytest.fixture(scope="module")
def real_store(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from rl.storage.artifacts import LocalArtifacts

    return LocalArtifacts(tmp_path_factory.mktemp("real-model-artifacts"))


@pytest.fixture(scope="module")
def real_engine(smollm2: Path, real_store: Any) -> Iterator[Any]:
    """The demo's engine for `--engine vllm` (`rl.deploy.local.make_engine`) on the real model; closed after this
    module."""
    from rl.deploy.local import make_engine

    engine = make_engine("vllm", open_model(smollm2), real_store, threads=2)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def trained(smollm2: Path) -> dict[str, bytes]:
    """An adapter of the demo's shape with small random B, standing in for a trained version."""
    from rl.bench.vllm_real import trained_like_adapter

    return trained_like_adapter(open_model(smollm2))


def test_vllm_samples_the_real_model_with_its_chat_template_and_the_trainers_log_probs(
    smollm2: Path, real_engine: Any, real_store: Any, trained: dict[str, bytes], record_property: Any
) -> None:
    import torch

    from rl.models import load_tokenizer
    from rl.models.chat import encode_prompt
    from rl.problems import Addition

    tokenizer = load_tokenizer(open_model(smollm2))
    ref = asyncio.run(real_store.put(trained, name="adapter-v1"))
    prompts = Addition().eval_prompts()[:PROMPTS]
    requests = [
        RolloutRequest(
            group_id=g, prompt=p, n=SAMPLES, adapter=ref, policy_version=1, seed=50 + g, max_tokens=MAX_TOKENS
        )
        for g, p in enumerate(prompts)
    ]
    groups = asyncio.run(real_engine.generate_groups(requests))
    rollouts = [r for g in groups for r in g]
    for prompt, group in zip(prompts, groups, strict=True):
        assert all(r.prompt_token_ids == encode_prompt(tokenizer, prompt.question) for r in group)  # the template
    eos = tokenizer.eos_token_id
    stopped = [r for r in rollouts if len(r.token_ids) < MAX_TOKENS]
    assert stopped and all(r.token_ids[-1] == eos for r in stopped)  # stopped at end-of-turn, nothing after it
    print("sample completions:", [tokenizer.decode(r.token_ids, skip_special_tokens=True) for r in groups[0]])

    policy = trainer_policy(smollm2, trained, torch.device("cpu"))
    gaps = summarize(logprob_gaps(rollouts, policy))
    line = f"mean |Δ| {gaps.mean:.2e}, max |Δ| {gaps.max:.2e} over {gaps.tokens} tokens"
    record_property("real_model_logprob_gap", line)
    print(f"SmolLM2, vLLM (CPU, float32) vs trainer log-probs: {line}")
    assert gaps.mean <= MEAN_BOUND and gaps.max <= MAX_BOUND, line
    with policy.disable_adapter():
        base = summarize(logprob_gaps(rollouts, policy))
    assert base.mean >= 100 * MEAN_BOUND, f"without the adapter: {base}"  # the bound tells the adapter's effect
