"""`rl.samplers.numerics`: the summary of first-step ratios both bf16 tests report, and the log-ratios they
summarise."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from fixtures_real import TEST_MODEL_CONFIG, one_thread, tiny_model_dir

from rl.models import load_base_model, load_tokenizer
from rl.models.opened_model import open_model
from rl.models.tiny import build_tiny_model
from rl.samplers.decoding import teacher_forced_logprobs
from rl.samplers.numerics import log_ratios, ratio_spread

__all__ = ["one_thread", "tiny_model_dir"]


def test_ratio_spread_of_a_hand_worked_case() -> None:
    """Five ratios 0.7, 0.9, 1.0, 1.1, 1.3. Percentiles interpolate between sorted neighbours at position q x (N - 1):
    p01 at 0.04, 0.7 + 0.04 x 0.2 = 0.708; p99 at 3.96, 1.1 + 0.96 x 0.2 = 1.292. Outside 1 +- 0.2: 0.7 and 1.3, 2/5.
    |ln r|: 0.35667, 0.10536, 0, 0.09531, 0.26236, mean 0.81970 / 5 = 0.16394."""
    spread = ratio_spread(torch.tensor([0.7, 0.9, 1.0, 1.1, 1.3], dtype=torch.float64).log(), clip_eps=0.2)
    assert spread.tokens == 5
    assert spread.min == pytest.approx(0.7) and spread.max == pytest.approx(1.3)
    assert spread.p01 == pytest.approx(0.708) and spread.p99 == pytest.approx(1.292)
    assert spread.clipped_fraction == pytest.approx(0.4)
    assert spread.mean_abs_log_ratio == pytest.approx(0.16394, abs=1e-5)
    assert spread.max_abs_log_ratio == pytest.approx(-math.log(0.7))


def test_ratio_spread_refuses_an_empty_set_of_tokens() -> None:
    with pytest.raises(ValueError, match="no log-ratios"):
        ratio_spread(torch.empty(0), clip_eps=0.2)


def test_batched_log_ratios_equal_each_pair_teacher_forced_alone(
    tiny_model_dir: Path, tmp_path: Path, one_thread: None
) -> None:
    """Two different float32 models (the tiny model and one built from another seed): one padded batch per model
    gives, token for token and in order, the differences of `teacher_forced_logprobs` run per pair (up to the batch's
    float32 rounding; a token one position off moves them by tenths), and an empty completion contributes no token."""
    tokenizer = load_tokenizer(open_model(tiny_model_dir))
    new = load_base_model(open_model(tiny_model_dir))
    other = replace(TEST_MODEL_CONFIG, seed=TEST_MODEL_CONFIG.seed + 1)
    old = load_base_model(open_model(build_tiny_model(tmp_path / "other", other), tokenizer=False))
    prompts = [tokenizer(q)["input_ids"] for q in ("3=", "what is 12 + 7? ", "45=")]
    completions = [[5, 6, 7], [], [8, 9, 10, 11, 12]]
    got = log_ratios(new, old, prompts, completions, pad_token_id=0)
    alone = [
        teacher_forced_logprobs(new, p, c).double() - teacher_forced_logprobs(old, p, c).double()
        for p, c in zip(prompts, completions, strict=True)
    ]
    assert got.shape == (8,) and got.dtype == torch.float64
    torch.testing.assert_close(got, torch.cat(alone).detach(), atol=1e-5, rtol=0)
    assert float(got.abs().min()) > 1e-3  # the models differ at every token: the comparison can see a shift
    assert float(log_ratios(new, new, prompts, completions, pad_token_id=0).abs().max()) == 0.0
