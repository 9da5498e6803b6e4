"""Prompts of different lengths decode as one batch, left-padded: each row samples what it samples alone."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from fixtures_real import one_thread, tiny_model_dir

from rl.models import load_base_model, load_tokenizer
from rl.models.opened_model import open_model
from rl.samplers import decoding
from rl.samplers.decoding import _cache_kwarg, _cache_of, sample_group, sample_groups

__all__ = ["one_thread", "tiny_model_dir"]


@pytest.mark.parametrize("pad_token_id", [None, 0])
def test_left_padded_groups_sample_what_each_samples_alone(tiny_model_dir: Path, pad_token_id: int | None) -> None:
    model, tokenizer = load_base_model(open_model(tiny_model_dir)), load_tokenizer(open_model(tiny_model_dir))
    prompts = [tokenizer(q)["input_ids"] for q in ("3=", "what is 12 + 7? ", "45=")]
    assert len({len(p) for p in prompts}) == 3  # three lengths: rows of the shorter prompts are padded
    eos = int(tokenizer.eos_token_id)
    batched = sample_groups(
        model, prompts, ns=[3, 2, 3], max_tokens=6, seeds=[5, 6, 7], eos_token_id=eos, pad_token_id=pad_token_id
    )
    for prompt, n, seed, group in zip(prompts, [3, 2, 3], [5, 6, 7], batched, strict=True):
        alone = sample_group(model, prompt, n=n, max_tokens=6, seed=seed, eos_token_id=eos)
        assert [s.token_ids for s in group] == [s.token_ids for s in alone]
        for s, a in zip(group, alone, strict=True):
            torch.testing.assert_close(torch.tensor(s.logprobs), torch.tensor(a.logprobs), atol=1e-5, rtol=0)


class _OtherCache:
    """A KV cache of another type than transformers' `DynamicCache`, as a model with its own cache type may have."""

    def __init__(self, cache: object) -> None:
        self.cache = cache


class _HidesCache(torch.nn.Module):
    """The model, its cache wrapped in `_OtherCache` going out and unwrapped coming back; records each batch size."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.inner, self.batches = model, []

    def forward(self, input_ids: torch.Tensor, past_key_values: _OtherCache | None = None, **kwargs: object) -> object:
        self.batches.append(int(input_ids.shape[0]))
        cache = None if past_key_values is None else past_key_values.cache
        out = self.inner(input_ids=input_ids, **{_cache_kwarg(self.inner): cache}, **kwargs)
        return SimpleNamespace(logits=out.logits, cache=_OtherCache(_cache_of(out)))


@pytest.mark.parametrize("ns", [[4, 4, 4], [3, 1, 2]], ids=["equal groups", "unequal groups"])
def test_each_prompt_is_forwarded_once_and_samples_what_a_row_per_sample_samples(
    tiny_model_dir: Path, ns: list[int]
) -> None:
    """From `prefill_once_min_parameters` up, the prefill forwards each prompt alone and repeats its cache per sample;
    below it, or for a cache that is not a plain `DynamicCache`, one padded row per sample. All sample the same tokens,
    log-probs equal up to batch rounding."""
    model, tokenizer = load_base_model(open_model(tiny_model_dir)), load_tokenizer(open_model(tiny_model_dir))
    prompts = [tokenizer(q)["input_ids"] for q in ("3=", "what is 12 + 7? ", "45=")]
    kwargs = {"ns": ns, "max_tokens": 6, "seeds": [5, 6, 7], "eos_token_id": int(tokenizer.eos_token_id)}
    seen: list[int] = []
    hook = model.register_forward_pre_hook(
        lambda _m, _a, kw: seen.append(int(kw["input_ids"].shape[0])), with_kwargs=True
    )
    try:
        small = sample_groups(model, prompts, **kwargs)  # the tiny model is under the threshold
        assert seen[0] == sum(ns)  # one padded row per sample
        seen.clear()
        grouped = sample_groups(model, prompts, **kwargs, prefill_once_min_parameters=0)
        assert seen[:3] == [1, 1, 1] and set(seen[3:]) == {sum(ns)}  # one row per prompt, alone
    finally:
        hook.remove()
    counted = _HidesCache(model)
    per_row = sample_groups(counted, prompts, **kwargs, prefill_once_min_parameters=0)
    assert counted.batches[:2] == [1, sum(ns)]  # the fallback: once more, one row per sample
    for group, rows, other in zip(grouped, per_row, small, strict=True):
        assert [s.token_ids for s in group] == [s.token_ids for s in rows] == [s.token_ids for s in other]
        for s, r, o in zip(group, rows, other, strict=True):
            torch.testing.assert_close(torch.tensor(s.logprobs), torch.tensor(r.logprobs), atol=1e-5, rtol=0)
            assert r.logprobs == o.logprobs  # the same padded row-per-sample prefill


@pytest.mark.parametrize("threshold", [0, decoding.PREFILL_ONCE_MIN_PARAMETERS], ids=["prompt once", "row per sample"])
def test_a_group_sampled_in_a_batch_is_bit_for_bit_the_group_sampled_alone(
    tiny_model_dir: Path, threshold: int
) -> None:
    """A group's prefill is the one-group call's own, so the Flyte tiers, which sample group by group, train the
    adapter the in-process loop trains from batched groups."""
    model, tokenizer = load_base_model(open_model(tiny_model_dir)), load_tokenizer(open_model(tiny_model_dir))
    prompts = [tokenizer(q)["input_ids"] for q in ("3=", "17=", "5=", "99=")]
    eos = int(tokenizer.eos_token_id)
    once = {"prefill_once_min_parameters": threshold}
    batched = sample_groups(model, prompts, ns=[8] * 4, max_tokens=4, seeds=[1, 2, 3, 4], eos_token_id=eos, **once)
    for prompt, seed, group in zip(prompts, [1, 2, 3, 4], batched, strict=True):
        alone = sample_group(model, prompt, n=8, max_tokens=4, seed=seed, eos_token_id=eos, **once)
        assert [(s.token_ids, s.logprobs) for s in group] == [(s.token_ids, s.logprobs) for s in alone]
