"""`rl.samplers.fast_forward`: the written-out decoder forward gives transformers' bits, or is not used.

Each check runs the same inputs through `causal_lm_forward` and through `model(...)` (or, for the sampler and trainer,
through the same functions with the written-out path turned off) and asserts `torch.equal`: logits, KV caches,
sampled tokens, log-probs and gradients. The models are random-init: the tiny demo's Qwen2 shape and a small Llama
shaped like SmolLM2 (tied embeddings, 3 query heads per KV head), each bare and under a PEFT LoRA adapter.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, GPT2Config, LlamaConfig, Qwen2Config

import rl.samplers.fast_forward as fast_forward
from rl.models.tiny import TinyModelConfig, build_tokenizer, qwen2_config
from rl.samplers.decoding import batched_teacher_forced_logprobs, sample_groups, teacher_forced_logprobs
from rl.samplers.fast_forward import causal_lm_forward, fast_plan
from rl.types import SamplingSettings

pytestmark = pytest.mark.skipif(
    not fast_forward.transformers_verified(), reason="written out for other transformers releases: it falls back"
)

VOCAB = 50
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _config(arch: str) -> Qwen2Config | LlamaConfig:
    if arch == "qwen2":  # the demo's shape, as rl.models.tiny builds it
        return qwen2_config(TinyModelConfig(), build_tokenizer())
    return LlamaConfig(  # SmolLM2-shaped: tied embeddings, 3 query heads per KV head
        vocab_size=VOCAB,
        hidden_size=48,
        num_hidden_layers=2,
        num_attention_heads=3,
        num_key_value_heads=1,
        intermediate_size=96,
        max_position_embeddings=128,
        initializer_range=0.2,
        tie_word_embeddings=True,
        rope_theta=100000.0,
    )


_MODELS: dict[tuple[str, str, bool], torch.nn.Module] = {}


def _model(arch: str, kernel: str, lora: bool) -> torch.nn.Module:
    """A random-init model, built once per (arch, kernel, lora); LoRA B is random too, so the adapter changes logits."""
    key = (arch, kernel, lora)
    if key not in _MODELS:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            model = AutoModelForCausalLM.from_config(_config(arch), dtype=torch.float32, attn_implementation=kernel)
            if lora:
                config = LoraConfig(
                    r=4,
                    lora_alpha=8,
                    lora_dropout=0.1,
                    target_modules=LORA_TARGETS,
                    init_lora_weights=False,
                    task_type="CAUSAL_LM",
                )
                model = get_peft_model(model, config)
        _MODELS[key] = model.eval()
    return _MODELS[key]


def _transformers_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fast_forward, "fast_plan", lambda model, cache=None: None)


def _assert_same_cache(a: object, b: object) -> None:
    layers_a, layers_b = a.layers, b.layers  # type: ignore[attr-defined]
    assert len(layers_a) == len(layers_b)
    for la, lb in zip(layers_a, layers_b, strict=True):
        assert torch.equal(la.keys, lb.keys) and torch.equal(la.values, lb.values)


models = st.tuples(st.sampled_from(["qwen2", "llama"]), st.sampled_from(["eager", "sdpa"]), st.booleans())


@settings(max_examples=10)
@given(models, st.integers(1, 5), st.integers(1, 7), st.integers(0, 2**31), st.booleans())
def test_prefill_and_decode_with_cache_and_left_padding_are_bitwise_transformers(spec, rows, width, seed, padded):
    model = _model(*spec)
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (rows, width), generator=gen)
    lengths = torch.randint(1, width + 1, (rows,), generator=gen) if padded else torch.full((rows,), width)
    mask = (torch.arange(width) >= width - lengths.unsqueeze(1)).long()  # [rows, width], left padding
    positions = (mask.cumsum(1) - 1).clamp(min=0)
    extra = {"attention_mask": mask, "position_ids": positions} if padded else {}
    with torch.no_grad():
        ours = causal_lm_forward(model, input_ids=ids, use_cache=True, **extra)
        theirs = model(input_ids=ids, use_cache=True, **extra)
        assert fast_plan(model) is not None
        assert torch.equal(ours.logits, theirs.logits)
        _assert_same_cache(ours.cache, theirs.cache)
        for _ in range(2):  # decode steps on each one's own cache
            nxt = torch.randint(0, VOCAB, (rows, 1), generator=gen)
            if padded:
                mask = torch.cat([mask, torch.ones((rows, 1), dtype=torch.long)], dim=1)
                positions = positions[:, -1:] + 1
                extra = {"attention_mask": mask, "position_ids": positions}
            ours = causal_lm_forward(model, input_ids=nxt, use_cache=True, cache=ours.cache, **extra)
            theirs = model(input_ids=nxt, use_cache=True, cache=theirs.cache, **extra)
            assert torch.equal(ours.logits, theirs.logits)
            _assert_same_cache(ours.cache, theirs.cache)


@settings(max_examples=8)
@given(models, st.integers(1, 4), st.integers(2, 7), st.integers(0, 3), st.integers(0, 2**31))
def test_a_full_forward_and_its_gradients_are_bitwise_transformers_with_dropout(spec, rows, width, keep, seed):
    model = _model(*spec)
    model.train()  # LoRA dropout draws masks: both paths must draw the same ones
    try:
        ids = torch.randint(0, VOCAB, (rows, width), generator=torch.Generator().manual_seed(seed))
        results = []
        for run in (causal_lm_forward, lambda m, **kw: m(**kw)):
            model.zero_grad(set_to_none=True)
            torch.manual_seed(seed)
            logits = run(model, input_ids=ids, use_cache=False, logits_to_keep=keep).logits
            (logits * torch.linspace(-1.0, 1.0, logits.numel()).view_as(logits)).sum().backward()
            grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
            results.append((logits.detach(), grads))
        (ours, our_grads), (theirs, their_grads) = results
        assert torch.equal(ours, theirs)
        assert our_grads.keys() == their_grads.keys() and our_grads
        assert all(torch.equal(our_grads[n], their_grads[n]) for n in our_grads)
    finally:
        model.zero_grad(set_to_none=True)
        model.eval()


def _teacher_forced(model, prompts, completions, share, sampling, seed):
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    logp, mask = batched_teacher_forced_logprobs(model, prompts, completions, 0, sampling, share_prompts=share)
    single = teacher_forced_logprobs(model, prompts[0], completions[0], sampling)
    (logp.sum() + single.sum()).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return logp.detach(), mask, single.detach(), grads


@pytest.mark.parametrize("spec", [("qwen2", "eager", True), ("qwen2", "sdpa", True), ("llama", "sdpa", True)])
@pytest.mark.parametrize("share", [True, False])
def test_the_trainers_log_probs_and_gradients_are_bitwise_transformers(monkeypatch, spec, share):
    model = _model(*spec)
    model.train()  # LoRA dropout on: the paths must draw the same masks
    try:
        # Two prompts of other lengths, each repeated (a shared-prompt batch), completions of other lengths.
        prompts = [[2, 5, 7], [2, 5, 7], [2, 9, 4, 4, 11], [2, 9, 4, 4, 11], [2, 5, 7]]
        completions = [[3, 1], [8, 8, 1], [6], [12, 13, 14, 1], [9, 9, 9]]
        sampling = SamplingSettings(temperature=0.7, top_k=20)
        ours = _teacher_forced(model, prompts, completions, share, sampling, seed=7)
        _transformers_only(monkeypatch)
        theirs = _teacher_forced(model, prompts, completions, share, sampling, seed=7)
    finally:
        model.zero_grad(set_to_none=True)
        model.eval()
    for a, b in zip(ours[:3], theirs[:3], strict=True):
        assert torch.equal(a, b)
    assert ours[3].keys() == theirs[3].keys() and ours[3]
    assert all(torch.equal(ours[3][n], theirs[3][n]) for n in ours[3])


@pytest.mark.parametrize("spec", [("qwen2", "eager", False), ("qwen2", "sdpa", True), ("llama", "eager", True)])
@pytest.mark.parametrize("prefill_once", [False, True])
def test_the_samplers_tokens_and_log_probs_are_bitwise_transformers(monkeypatch, spec, prefill_once):
    model = _model(*spec)
    args = {"ns": [3, 2], "max_tokens": 6, "seeds": [11, 12], "eos_token_id": 1}
    if prefill_once:  # each prompt forwarded alone, its cache repeated and padded (a real model's path)
        args["prefill_once_min_parameters"] = 0
    prompts = [[2, 5, 7, 9], [2, 6]]  # other lengths: left padding
    ours = sample_groups(model, prompts, **args)
    _transformers_only(monkeypatch)
    theirs = sample_groups(model, prompts, **args)
    assert ours == theirs
    assert any(len(s.token_ids) > 1 for group in ours for s in group)


def test_what_it_does_not_write_out_goes_through_transformers_forward():
    model = _model("qwen2", "eager", False)
    ids = torch.tensor([[2, 5, 7, 9]])
    with torch.no_grad():
        expected = model(input_ids=ids, use_cache=False).logits
        hook = model.model.layers[0].register_forward_hook(lambda *args: None)  # a skipped module's hook must run
        try:
            assert fast_plan(model) is None
            assert torch.equal(causal_lm_forward(model, input_ids=ids, use_cache=False).logits, expected)
        finally:
            hook.remove()
        assert fast_plan(model) is not None
        model.config.output_attentions = True  # output capture installs hooks transformers needs
        try:
            assert fast_plan(model) is None
        finally:
            model.config.output_attentions = False
        model.gradient_checkpointing_enable()
        try:
            assert fast_plan(model) is None
        finally:
            model.gradient_checkpointing_disable()
        other = AutoModelForCausalLM.from_config(
            GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=1, n_head=2, n_positions=32)
        ).eval()
        assert fast_plan(other) is None
        assert torch.equal(causal_lm_forward(other, input_ids=ids, use_cache=False).logits, other(input_ids=ids).logits)


def _final_adapter_sha256(out: Path) -> str:
    state = json.loads((out / "checkpoint.json").read_text())["state"]
    digest = state["adapter"]["digest"].removeprefix("sha256:")
    return hashlib.sha256(
        (out / "artifacts" / "objects" / digest / "adapter_model.safetensors").read_bytes()
    ).hexdigest()


@pytest.mark.heavy
def test_the_demos_final_adapter_is_the_transformers_paths_bit_for_bit(tmp_path, monkeypatch, capsys):
    from rl.cli import main

    args = ["demo", "grpo", "--iterations", "3", "--prompts", "2", "--samples", "4", "--json", "--out"]
    calls = {"written out": 0}
    real_plan = fast_forward.fast_plan

    def counting(model, cache=None):
        plan = real_plan(model, cache)
        calls["written out"] += plan is not None
        return plan

    monkeypatch.setattr(fast_forward, "fast_plan", counting)
    main([*args, str(tmp_path / "ours")])
    assert calls["written out"] > 0
    _transformers_only(monkeypatch)
    main([*args, str(tmp_path / "theirs")])
    capsys.readouterr()
    assert _final_adapter_sha256(tmp_path / "ours") == _final_adapter_sha256(tmp_path / "theirs")
