"""The trainer's batched teacher forcing: the head only where a log-prob is read, and each distinct prompt forwarded
once (a GRPO group's rows share one). Both give the one-row-at-a-time values and gradients up to float rounding."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from fixtures_real import one_thread, tiny_model_dir
from peft import LoraConfig, get_peft_model

from rl.models import load_base_model, load_tokenizer
from rl.models.opened_model import open_model
from rl.samplers import decoding
from rl.samplers.decoding import batched_teacher_forced_logprobs, teacher_forced_logprobs
from rl.types import SamplingSettings

__all__ = ["one_thread", "tiny_model_dir"]


def _batch(tiny_model_dir: Path) -> tuple[list[list[int]], list[list[int]]]:
    """Three prompts of three lengths, the first two repeated (groups of 3, 2 and 1), completions of 1-5 tokens."""
    tokenizer = load_tokenizer(open_model(tiny_model_dir))
    a, b, c = (tokenizer(q)["input_ids"] for q in ("3=", "what is 12 + 7? ", "45="))
    assert len({len(a), len(b), len(c)}) == 3
    prompts = [a, b, a, c, b, a]
    completions = [[5, 6, 7], [8], [9, 10, 11, 12, 13], [14, 15], [16, 17, 18], [19, 20]]
    return prompts, completions


def _policy(tiny_model_dir: Path) -> torch.nn.Module:
    torch.manual_seed(0)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    return get_peft_model(load_base_model(open_model(tiny_model_dir)), config)


def _lora_grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    return grads


@pytest.mark.parametrize("share", [True, False], ids=["shared prompts", "full rows"])
@pytest.mark.parametrize("sampling", [SamplingSettings(), SamplingSettings(temperature=0.7, top_k=20)])
def test_each_path_gives_the_one_row_values_and_gradients(
    tiny_model_dir: Path, share: bool, sampling: SamplingSettings
) -> None:
    model = _policy(tiny_model_dir)
    prompts, completions = _batch(tiny_model_dir)
    weights = torch.linspace(0.5, 1.5, 5)  # a loss that weighs positions unequally, so gradients are not symmetric
    logp, mask = batched_teacher_forced_logprobs(model, prompts, completions, 0, sampling, share_prompts=share)
    assert logp.shape == mask.shape == (6, 5)
    (logp * weights).sum().backward()
    batched = _lora_grads(model)
    assert batched and any(g.abs().sum() > 0 for g in batched.values())
    total = torch.zeros(())
    for b, (p, c) in enumerate(zip(prompts, completions, strict=True)):
        alone = teacher_forced_logprobs(model, p, c, sampling)  # [T]
        assert int(mask[b].sum()) == len(c) and not logp[b, len(c) :].any()
        torch.testing.assert_close(logp[b, : len(c)].detach(), alone.detach(), rtol=0, atol=1e-5)
        total = total + (alone * weights[: len(c)]).sum()
    total.backward()
    for name, grad in _lora_grads(model).items():
        scale = float(grad.abs().max())  # summed over rows and positions: rounding scales with the largest entry
        torch.testing.assert_close(
            batched[name], grad, rtol=1e-4, atol=1e-4 * scale, msg=lambda m, name=name: f"{name}: {m}"
        )


def test_shared_prompts_forward_each_distinct_prompt_once(tiny_model_dir: Path) -> None:
    model = load_base_model(open_model(tiny_model_dir))
    prompts, completions = _batch(tiny_model_dir)
    shapes: list[tuple[int, ...]] = []
    hook = model.register_forward_pre_hook(
        lambda _m, _a, kw: shapes.append(tuple(kw["input_ids"].shape)), with_kwargs=True
    )
    try:
        with torch.no_grad():
            batched_teacher_forced_logprobs(model, prompts, completions, 0, share_prompts=True)
    finally:
        hook.remove()
    assert shapes == [(3, max(len(p) for p in prompts)), (6, 5)]  # the 3 distinct prompts together, then completions


def test_the_default_shares_only_large_models_without_dropout(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = load_base_model(open_model(tiny_model_dir))
    prompts, completions = _batch(tiny_model_dir)
    calls: list[int] = []
    real = decoding._shared_prompt_logits
    monkeypatch.setattr(decoding, "_shared_prompt_logits", lambda *a: calls.append(1) or real(*a))
    with torch.no_grad():
        batched_teacher_forced_logprobs(model, prompts, completions, 0)
        assert calls == []  # the tiny model is under the size where sharing pays
        batched_teacher_forced_logprobs(model, prompts, completions, 0, prefill_once_min_parameters=0)
        assert calls == [1]
        dropped = get_peft_model(model, LoraConfig(r=2, target_modules=["q_proj"], lora_dropout=0.1)).train()
        batched_teacher_forced_logprobs(dropped, prompts, completions, 0, prefill_once_min_parameters=0)
        assert calls == [1]  # a shared prompt would give a group's rows one dropout mask, not one each


def test_distinct_prompts_take_the_full_row_path(tiny_model_dir: Path) -> None:
    """With no prompt repeated there is nothing to share: one forward of the full rows."""
    model = load_base_model(open_model(tiny_model_dir))
    prompts, completions = _batch(tiny_model_dir)
    rows = [0, 1, 3]
    shapes: list[int] = []
    hook = model.register_forward_pre_hook(lambda _m, _a, kw: shapes.append(kw["input_ids"].shape[0]), with_kwargs=True)
    try:
        with torch.no_grad():
            batched_teacher_forced_logprobs(
                model, [prompts[i] for i in rows], [completions[i] for i in rows], 0, share_prompts=True
            )
    finally:
        hook.remove()
    assert shapes == [3]
