"""Laws of the GRPO loss: REINFORCE at ratio 1, the clip, the k3 KL, a float64 reference, and batch aggregation."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st
from strategies import advantages, logprob_tensors

from rl.algorithm.loss import clip_fraction, grpo_masked_loss, grpo_masked_row_losses, grpo_sample_loss, k3_kl

CLIP_EPS = st.floats(min_value=0.05, max_value=0.4)
CLIP_EPS_HIGH = st.one_of(st.none(), st.floats(min_value=0.05, max_value=0.5))
KL_BETA = st.floats(min_value=0.0, max_value=0.5)


def _reference(new, old, ref, advantage, eps_low, eps_high, beta):
    """The loss, its stats and d loss / d new, written out token by token in float64 from the formulas."""
    t_len = len(new)
    ratio = [math.exp(n - o) for n, o in zip(new, old, strict=True)]
    surrogate = [min(r * advantage, min(max(r, 1 - eps_low), 1 + eps_high) * advantage) for r in ratio]
    delta = [rf - n for rf, n in zip(ref, new, strict=True)]
    kl = [math.exp(d) - d - 1 for d in delta]
    loss = -(math.fsum(surrogate) / t_len - beta * math.fsum(kl) / t_len)
    # The unclipped term is the minimum (so it carries the gradient A * r) unless the clip binds on the side that
    # would raise the objective; d k3 / d new = 1 - exp(delta).
    unclipped = [(advantage >= 0 and r <= 1 + eps_high) or (advantage < 0 and r >= 1 - eps_low) for r in ratio]
    grad = [
        (-(advantage * r if keep else 0.0) + beta * (1 - math.exp(d))) / t_len
        for r, keep, d in zip(ratio, unclipped, delta, strict=True)
    ]
    stats = {
        "loss": loss,
        "ratio": math.fsum(ratio) / t_len,
        "kl": math.fsum(kl) / t_len,
        "clip_frac": sum(r < 1 - eps_low or r > 1 + eps_high for r in ratio) / t_len,
    }
    return stats, grad


def _near_a_clip_boundary(ratios, eps_low, eps_high, rel=1e-5):
    return any(math.isclose(r, b, rel_tol=rel) for r in ratios for b in (1 - eps_low, 1 + eps_high))


def _t(values, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype)


def _leaf(t: torch.Tensor) -> torch.Tensor:
    return t.detach().clone().requires_grad_(True)


@given(data=st.data())
def test_gradient_at_ratio_one_without_kl_equals_reinforce(data):
    """With new = old (every ratio 1) and kl_beta=0, d loss / d new_logp is REINFORCE's, -A/T on every token."""
    new, _, ref = data.draw(logprob_tensors())
    advantage = data.draw(advantages())
    new = _leaf(new)
    loss, _ = grpo_sample_loss(new, new.detach().clone(), ref, advantage, clip_eps=data.draw(CLIP_EPS), kl_beta=0.0)
    loss.backward()
    reinforce = _leaf(new)
    (-advantage * reinforce.mean()).backward()
    t_len = new.shape[0]
    assert torch.allclose(new.grad, reinforce.grad, rtol=1e-12, atol=1e-15)
    assert torch.allclose(new.grad, torch.full_like(new, -advantage / t_len), rtol=1e-12, atol=1e-15)


@given(data=st.data())
def test_k3_is_nonnegative(data):
    """k3(ref, new) >= 0 on every token, in float32 and float64, for log-prob gaps up to +-30."""
    dtype = data.draw(st.sampled_from([torch.float32, torch.float64]))
    gaps = data.draw(st.lists(st.floats(min_value=-30, max_value=30), min_size=1, max_size=16))
    new = torch.tensor(data.draw(st.lists(st.floats(-20, 0), min_size=len(gaps), max_size=len(gaps))), dtype=dtype)
    ref = new + torch.tensor(gaps, dtype=dtype)
    assert bool((k3_kl(ref, new) >= 0).all())


@given(data=st.data())
def test_k3_is_exactly_zero_when_ref_equals_new(data):
    """Where the reference and the policy agree on a token, its k3 is exactly 0 (not merely small)."""
    new, _, _ = data.draw(logprob_tensors(dtype=data.draw(st.sampled_from([torch.float32, torch.float64]))))
    assert bool((k3_kl(new.clone(), new) == 0).all())


@given(data=st.data())
def test_surrogate_gradient_is_zero_beyond_the_upper_clip_for_positive_advantage(data):
    """For A > 0 and every ratio > 1 + eps_high, the surrogate is flat: d loss / d new_logp is exactly 0."""
    eps = data.draw(CLIP_EPS)
    _, old, ref = data.draw(logprob_tensors())
    log_ratios = st.floats(min_value=math.log1p(eps) + 1e-3, max_value=1.0)
    new = _leaf(old + torch.tensor(data.draw(st.lists(log_ratios, min_size=len(old), max_size=len(old)))))
    loss, stats = grpo_sample_loss(new, old, ref, data.draw(st.floats(0.01, 3.0)), clip_eps=eps, kl_beta=0.0)
    loss.backward()
    assert stats["clip_frac"] == 1.0
    assert bool((new.grad == 0).all())


@given(data=st.data())
def test_surrogate_gradient_is_zero_beyond_the_lower_clip_for_negative_advantage(data):
    """For A < 0 and every ratio < 1 - eps, the surrogate is flat: d loss / d new_logp is exactly 0."""
    eps = data.draw(CLIP_EPS)
    _, old, ref = data.draw(logprob_tensors())
    log_ratios = st.floats(min_value=-1.0, max_value=math.log1p(-eps) - 1e-3)
    new = _leaf(old + torch.tensor(data.draw(st.lists(log_ratios, min_size=len(old), max_size=len(old)))))
    loss, stats = grpo_sample_loss(new, old, ref, data.draw(st.floats(-3.0, -0.01)), clip_eps=eps, kl_beta=0.0)
    loss.backward()
    assert stats["clip_frac"] == 1.0
    assert bool((new.grad == 0).all())


@given(data=st.data())
def test_loss_and_gradient_agree_with_a_float64_reference(data):
    """On float64 inputs, the loss, every stat and d loss / d new_logp match a token-by-token float64 reference."""
    new, old, ref = data.draw(logprob_tensors())
    advantage, eps, eps_high, beta = (data.draw(s) for s in (advantages(), CLIP_EPS, CLIP_EPS_HIGH, KL_BETA))
    high = eps if eps_high is None else eps_high
    expected, expected_grad = _reference(new.tolist(), old.tolist(), ref.tolist(), advantage, eps, high, beta)
    assume(not _near_a_clip_boundary((new - old).exp().tolist(), eps, high, rel=1e-12))
    new = _leaf(new)
    loss, stats = grpo_sample_loss(new, old, ref, advantage, clip_eps=eps, kl_beta=beta, clip_eps_high=eps_high)
    loss.backward()
    assert stats.keys() == expected.keys()
    for key, value in expected.items():
        assert math.isclose(stats[key], value, rel_tol=1e-12, abs_tol=1e-12), key
    assert math.isclose(float(loss.detach()), expected["loss"], rel_tol=1e-12, abs_tol=1e-12)
    for got, want in zip(new.grad.tolist(), expected_grad, strict=True):
        assert math.isclose(got, want, rel_tol=1e-10, abs_tol=1e-12)


@given(data=st.data())
def test_float32_loss_agrees_with_the_float64_reference(data):
    """On float32 inputs (the trainer's dtype) the loss and stats match the float64 reference to float32 accuracy."""
    new, old, ref = data.draw(logprob_tensors(dtype=torch.float32))
    advantage, eps, eps_high, beta = (data.draw(s) for s in (advantages(), CLIP_EPS, CLIP_EPS_HIGH, KL_BETA))
    high = eps if eps_high is None else eps_high
    # The reference sees the same float32-rounded inputs, widened exactly to float64 by tolist().
    expected, _ = _reference(new.tolist(), old.tolist(), ref.tolist(), advantage, eps, high, beta)
    assume(not _near_a_clip_boundary((new.double() - old.double()).exp().tolist(), eps, high))
    _, stats = grpo_sample_loss(new, old, ref, advantage, clip_eps=eps, kl_beta=beta, clip_eps_high=eps_high)
    for key, value in expected.items():
        assert math.isclose(stats[key], value, rel_tol=1e-5, abs_tol=1e-5), key


@given(data=st.data())
def test_clip_frac_is_a_fraction_of_tokens(data):
    """clip_frac lies in [0, 1] and is a whole number of tokens out of T."""
    new, old, ref = data.draw(logprob_tensors(max_log_ratio=1.0))
    _, stats = grpo_sample_loss(
        new, old, ref, 1.0, clip_eps=data.draw(CLIP_EPS), clip_eps_high=data.draw(CLIP_EPS_HIGH)
    )
    t_len = new.shape[0]
    assert 0.0 <= stats["clip_frac"] <= 1.0
    assert math.isclose(stats["clip_frac"] * t_len, round(stats["clip_frac"] * t_len), abs_tol=1e-9)


@given(data=st.data())
def test_clip_eps_high_defaults_to_clip_eps(data):
    """Leaving clip_eps_high unset is the same, bit for bit, as setting it to clip_eps (symmetric clipping)."""
    new, old, ref = data.draw(logprob_tensors())
    advantage, eps = data.draw(advantages()), data.draw(CLIP_EPS)
    loss_a, stats_a = grpo_sample_loss(new, old, ref, advantage, clip_eps=eps)
    loss_b, stats_b = grpo_sample_loss(new, old, ref, advantage, clip_eps=eps, clip_eps_high=eps)
    assert float(loss_a) == float(loss_b)
    assert stats_a == stats_b


@pytest.mark.parametrize(
    ("ratio", "advantage", "clip_eps_high", "clipped"),
    [
        (1.25, 1.0, None, True),  # symmetric 0.2: 1.25 > 1.2 is clipped
        (1.25, 1.0, 0.28, False),  # clip-higher 0.28: 1.25 < 1.28 keeps its gradient
        (1.30, 1.0, 0.28, True),  # and 1.30 > 1.28 is clipped again
        (0.79, -1.0, 0.28, True),  # the lower bound still uses clip_eps: 0.79 < 0.8
        (0.81, -1.0, 0.28, False),
    ],
)
def test_asymmetric_clip_moves_only_the_upper_bound(ratio, advantage, clip_eps_high, clipped):
    """clip_eps_high widens or narrows only the upper bound; the lower bound stays 1 - clip_eps."""
    old = torch.tensor([-1.0], dtype=torch.float64)
    new = _leaf(old + math.log(ratio))
    loss, stats = grpo_sample_loss(
        new, old, new.detach(), advantage, clip_eps=0.2, kl_beta=0.0, clip_eps_high=clip_eps_high
    )
    loss.backward()
    assert (float(new.grad[0]) == 0.0) == clipped
    assert stats["clip_frac"] == (1.0 if clipped else 0.0)


def test_clip_fraction_counts_tokens_outside_the_band():
    """clip_fraction counts ratios strictly outside [1 - eps_low, 1 + eps_high]: 0.5 and 1.5 of five tokens."""
    ratio = torch.tensor([0.5, 0.9, 1.0, 1.1, 1.5], dtype=torch.float64)
    assert float(clip_fraction(ratio, 0.2, 0.2)) == 2 / 5
    assert float(clip_fraction(ratio, 0.2, 0.05)) == 3 / 5  # 1.1 > 1.05 as well


def test_batch_loss_matches_a_hand_computed_case():
    """Two completions of different lengths, padded to one [2, 2] batch: the batch loss is the mean of per-completion
    token means, worked by hand."""
    ln2 = math.log(2.0)
    # Row 0: T=2, new = old = ref, A = 1. Ratio 1, k3 0, surrogate mean 1  ->  loss_0 = -1.
    # Row 1: T=1 (its second position is padding), new - old = ln 2 (ratio 2), ref - new = ln 2, A = -0.5, eps 0.2,
    #   beta 0.1: unclipped 2 * -0.5 = -1.0, clipped 1.2 * -0.5 = -0.6, min = -1.0; k3 = e^ln2 - ln2 - 1 = 1 - ln2;
    #   loss_1 = -(-1.0 - 0.1 * (1 - ln2)) = 1 + 0.1 * (1 - ln2) ~ 1.0306853
    new = _leaf(_t([[-1.0, -2.0], [-2.0 + ln2, 7.0]], torch.float64))
    old = _t([[-1.0, -2.0], [-2.0, -9.0]], torch.float64)
    ref = _t([[-1.0, -2.0], [-2.0 + 2 * ln2, 3.0]], torch.float64)
    mask = torch.tensor([[True, True], [True, False]])
    loss, stats = grpo_masked_loss(new, old, ref, _t([1.0, -0.5], torch.float64), mask, clip_eps=0.2, kl_beta=0.1)
    # Batch: (loss_0 + loss_1) / 2 = 0.1 * (1 - ln2) / 2 ~ 0.0153426. A token mean over all three tokens would instead
    # give (-1 - 1 + 1.0306853) / 3 ~ -0.3231: the aggregation weighs completions, not tokens.
    assert math.isclose(float(loss), 0.1 * (1 - ln2) / 2, rel_tol=1e-12)
    assert math.isclose(stats["loss"], 0.1 * (1 - ln2) / 2, rel_tol=1e-12)
    assert math.isclose(stats["ratio"], (1.0 + 2.0) / 2, rel_tol=1e-12)
    assert math.isclose(stats["kl"], (0.0 + (1 - ln2)) / 2, rel_tol=1e-12)
    assert stats["clip_frac"] == (0.0 + 1.0) / 2  # |2 - 1| > 0.2 on row 1's only token
    loss.backward()
    # Row 0: d/dnew of -(mean_t r_t * 1) at r = 1 is -1/T = -1/2 per token, halved by the batch mean: -0.25.
    assert torch.allclose(new.grad[0], _t([-0.25, -0.25], torch.float64), rtol=1e-12)
    # Row 1: the unclipped term is the min, so d(-r A)/dnew = -A r = 1.0; d(beta k3)/dnew = beta (1 - e^ln2) = -0.1;
    # (1.0 - 0.1) / T=1, halved by the batch mean: 0.45. Its padded position gets nothing.
    assert math.isclose(float(new.grad[1, 0]), 0.45, rel_tol=1e-12)
    assert float(new.grad[1, 1]) == 0.0


@given(data=st.data())
def test_batch_loss_is_the_mean_of_sample_losses(data):
    """Law: the padded batch loss and its gradient equal the mean of the per-completion losses and their gradients,
    so a trainer may take one batched backward or accumulate one completion at a time."""
    n = data.draw(st.integers(min_value=1, max_value=4))
    raw = [(*data.draw(logprob_tensors()), data.draw(advantages())) for _ in range(n)]
    new, mask = _padded([r[0] for r in raw], 0.0)
    old, _ = _padded([r[1] for r in raw], 0.0)
    ref, _ = _padded([r[2] for r in raw], 0.0)
    new = _leaf(new)
    loss, _ = grpo_masked_loss(new, old, ref, _t([r[3] for r in raw], torch.float64), mask)
    loss.backward()
    singles = [_leaf(r[0]) for r in raw]
    sample_losses = [grpo_sample_loss(leaf, *r[1:])[0] for leaf, r in zip(singles, raw, strict=True)]
    for sample_loss in sample_losses:
        (sample_loss / n).backward()
    assert math.isclose(float(loss), math.fsum(float(x) for x in sample_losses) / n, rel_tol=1e-12, abs_tol=1e-12)
    for b, leaf in enumerate(singles):
        assert torch.allclose(new.grad[b, : len(leaf)], leaf.grad, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (([-1.0], _t([-1.0]), _t([-1.0]), 1.0), "new_logp must be a torch.Tensor"),
        ((_t([[-1.0]]), _t([[-1.0]]), _t([[-1.0]]), 1.0), r"new_logp must be 1-D .* shape \(1, 1\)"),
        ((_t(-1.0), _t(-1.0), _t(-1.0), 1.0), r"must be 1-D .* shape \(\)"),
        ((_t([]), _t([]), _t([]), 1.0), "at least one token"),
        ((_t([-1.0, -2.0]), _t([-1.0]), _t([-1.0, -2.0]), 1.0), "one length"),
        ((_t([-1.0]), _t([-1.0]), torch.tensor([-1]), 1.0), "ref_logp must be a floating-point tensor"),
        ((_t([-1.0]), _t([-1.0]), _t([-1.0]), math.nan), "advantage must be finite"),
    ],
)
def test_malformed_inputs_raise_value_error_saying_what_is_wrong(args, message):
    """Non-tensors, tensors that are not 1-D, empty, of unequal lengths or integral, and a NaN advantage raise."""
    with pytest.raises(ValueError, match=message):
        grpo_sample_loss(*args)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"clip_eps": -0.1}, "clip_eps must be >= 0"),
        ({"clip_eps_high": -0.1}, "clip_eps_high must be >= 0"),
        ({"kl_beta": -0.01}, "kl_beta must be >= 0"),
        ({"kl_beta": math.inf}, "kl_beta must be finite"),
    ],
)
def test_negative_or_infinite_constants_raise(kwargs, message):
    """A negative clip epsilon or KL coefficient, or an infinite one, raises ValueError naming it."""
    with pytest.raises(ValueError, match=message):
        grpo_sample_loss(_t([-1.0]), _t([-1.0]), _t([-1.0]), 1.0, **kwargs)


def _padded(rows, pad_value):
    """Right-pad 1-D tensors to one `[B, T_max]` tensor holding `pad_value` past each row's end, and its mask."""
    t_max = max(len(r) for r in rows)
    out = torch.full((len(rows), t_max), pad_value, dtype=rows[0].dtype)
    mask = torch.zeros(len(rows), t_max, dtype=torch.bool)
    for b, r in enumerate(rows):
        out[b, : len(r)] = r
        mask[b, : len(r)] = True
    return out, mask


@given(data=st.data())
def test_masked_batch_loss_equals_the_sample_loss_row_by_row(data):
    """Law: the padded [B, T] loss the trainer back-propagates from one batched forward gives each row the value,
    stats and gradient `grpo_sample_loss` gives that row's unpadded tokens, whatever the padding holds (float rounding
    only)."""
    n = data.draw(st.integers(min_value=1, max_value=5))
    raw = [(*data.draw(logprob_tensors(dtype=torch.float32)), data.draw(advantages())) for _ in range(n)]
    eps, eps_high, beta = data.draw(CLIP_EPS), data.draw(CLIP_EPS_HIGH), data.draw(KL_BETA)
    pad = data.draw(st.sampled_from([0.0, -30.0, 50.0]))
    new, mask = _padded([r[0] for r in raw], pad)
    old, _ = _padded([r[1] for r in raw], pad)
    ref, _ = _padded([r[2] for r in raw], pad)
    new = _leaf(new)
    adv = torch.tensor([r[3] for r in raw])
    rows, stats = grpo_masked_row_losses(new, old, ref, adv, mask, eps, beta, eps_high)
    rows.sum().backward()
    for b, (n_b, o_b, r_b, a_b) in enumerate(raw):
        leaf = _leaf(n_b)
        want, want_stats = grpo_sample_loss(leaf, o_b, r_b, a_b, eps, beta, eps_high)
        want.backward()
        assert math.isclose(float(rows[b]), float(want), rel_tol=1e-5, abs_tol=1e-6)
        for key in ("ratio", "kl", "clip_frac"):
            assert math.isclose(float(stats[key][b]), want_stats[key], rel_tol=1e-5, abs_tol=1e-6), key
        assert torch.allclose(new.grad[b, : len(n_b)], leaf.grad, rtol=1e-5, atol=1e-7)
        assert not bool(new.grad[b, len(n_b) :].any()), "a padded position received gradient"
    loss, mean_stats = grpo_masked_loss(
        new.detach(), old, ref, adv, mask, clip_eps=eps, kl_beta=beta, clip_eps_high=eps_high
    )
    assert math.isclose(float(loss), float(rows.mean()), rel_tol=1e-6, abs_tol=1e-7)
    assert math.isclose(mean_stats["kl"], float(stats["kl"].mean()), rel_tol=1e-6, abs_tol=1e-7)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"mask": torch.zeros(2, 3, dtype=torch.bool)}, r"rows \[0, 1\] of the mask have no tokens"),
        ({"advantages": torch.tensor([1.0, math.nan])}, "advantages must be finite"),
        ({"advantages": torch.tensor([1.0])}, r"advantages must have shape \[B\] = \[2\]"),
        ({"old_logp": torch.zeros(2, 4)}, "must share one"),
        ({"new_logp": torch.zeros(3)}, r"new_logp must be a 2-D floating-point tensor"),
        (
            {
                **dict.fromkeys(("new_logp", "old_logp", "ref_logp", "mask"), torch.zeros(0, 3)),
                "advantages": torch.zeros(0),
            },
            r"an empty batch \(B = 0\)",
        ),
    ],
)
def test_masked_loss_refuses_malformed_batches(change, message):
    """A padded batch whose shapes disagree, an empty row, an empty batch or a NaN advantage raise ValueError saying
    which (an empty batch's mean would be NaN)."""
    args = {
        "new_logp": torch.zeros(2, 3),
        "old_logp": torch.zeros(2, 3),
        "ref_logp": torch.zeros(2, 3),
        "advantages": torch.tensor([1.0, -1.0]),
        "mask": torch.ones(2, 3, dtype=torch.bool),
    }
    args.update(change)
    with pytest.raises(ValueError, match=message):
        grpo_masked_loss(**args)
