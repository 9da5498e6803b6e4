"""Prompts of different lengths decode as one batch, left-padded: each row samples what it samples alone."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from fixtures_real import one_thread, tiny_model_dir

from rl.engines.decoding import sample_group, sample_groups
from rl.models import load_base_model, load_tokenizer

__all__ = ["one_thread", "tiny_model_dir"]


@pytest.mark.parametrize("pad_token_id", [None, 0])
def test_left_padded_groups_sample_what_each_samples_alone(tiny_model_dir: Path, pad_token_id: int | None) -> None:
    model, tokenizer = load_base_model(tiny_model_dir), load_tokenizer(tiny_model_dir)
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
