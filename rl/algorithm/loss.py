"""The GRPO policy loss: a PPO-style clipped importance-ratio surrogate plus a k3 KL penalty towards the reference.

For one completion of T tokens with advantage A (Shao et al., "DeepSeekMath", 2024, eq. 3, token-level form):

    r_t  = exp(new_t - old_t)                                          importance ratio, new over behaviour policy
    L    = -( mean_t min(r_t A, clip(r_t, 1 - eps_low, 1 + eps_high) A)  -  beta mean_t k3_t )
    k3_t = exp(d_t) - d_t - 1,   d_t = ref_t - new_t                   (Schulman, "Approximating KL divergence")

and a batch's loss is the mean over completions of their token-mean losses (the tutorial's aggregation, GRPO's 1/G sum_i
1/|o_i| sum_t). `old` is the log-probability under the policy that sampled the token (one step stale when generation
overlaps training), `ref` under the frozen base with the adapter off; only `new` carries gradient. Each term is its
own small function, so a variant (another KL estimator, another aggregation) is a new function, not a flag.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = [
    "clip_fraction",
    "clipped_surrogate",
    "grpo_masked_loss",
    "grpo_masked_row_losses",
    "grpo_sample_loss",
    "importance_ratio",
    "k3_kl",
]


def importance_ratio(new_logp: Tensor, old_logp: Tensor) -> Tensor:
    """Per-token importance ratio `r_t = exp(new_t - old_t)` of the policy being trained over the one that sampled.

    PPO (Schulman et al., 2017) as used by GRPO (DeepSeekMath). Gradient flows through `new_logp` only.

    Shape: `new_logp`, `old_logp`: `[T]` -> `[T]`.
    """
    return torch.exp(new_logp - old_logp.detach())


def clipped_surrogate(ratio: Tensor, advantage: float | Tensor, clip_eps_low: float, clip_eps_high: float) -> Tensor:
    """Per-token pessimistic surrogate `min(r_t A, clip(r_t, 1 - eps_low, 1 + eps_high) A)`.

    PPO's clipped objective as GRPO uses it (DeepSeekMath, eq. 3); separate low and high bounds are DAPO's "clip-higher"
    (Yu et al., 2025). Where the clip binds on the side that would raise the objective (A > 0 and r > 1 + eps_high, or
    A < 0 and r < 1 - eps_low) the term is constant in `r`, so its gradient is zero: a stale sample cannot push the
    policy further than the trust region. On the other side the unclipped term is kept, so a move that lowers the
    objective is always corrected.

    Shape: `ratio`: `[T]` -> `[T]` (or `[B, T]` with advantages `[B, 1]`, the padded batch form).
    """
    clipped = torch.clamp(ratio, 1.0 - clip_eps_low, 1.0 + clip_eps_high)
    return torch.minimum(ratio * advantage, clipped * advantage)


def k3_kl(ref_logp: Tensor, new_logp: Tensor) -> Tensor:
    """Per-token k3 estimator of KL(new || ref): `exp(d) - d - 1` with `d = ref - new`, on tokens sampled from new.

    Schulman, "Approximating KL divergence" (2020): unbiased, always >= 0, and lower-variance than `-d` (k1) or `d**2/2`
    (k2). Computed as `expm1(d) - d`, the same value without the cancellation of `exp(d) - 1` near `d = 0`, so it stays
    >= 0 in floating point and is exactly 0 where `ref == new`. Gradient flows through `new_logp` only.

    Shape: `ref_logp`, `new_logp`: `[T]` -> `[T]`.
    """
    delta = ref_logp.detach() - new_logp
    return torch.expm1(delta) - delta


def clip_fraction(ratio: Tensor, clip_eps_low: float, clip_eps_high: float) -> Tensor:
    """Fraction of tokens whose ratio lies outside `[1 - eps_low, 1 + eps_high]`, whatever the advantage's sign.

    The tutorial's diagnostic `mean(|r - 1| > eps)` when the bounds are equal: how far the sampling policy has drifted
    from the one being trained, not how many tokens had their gradient cut (that also depends on the sign of A).

    Shape: `ratio`: `[T]` -> `[]`.
    """
    shifted = ratio.detach() - 1.0
    outside = (shifted < -clip_eps_low) | (shifted > clip_eps_high)
    return outside.to(ratio.dtype).mean()


def grpo_sample_loss(
    new_logp: Tensor,
    old_logp: Tensor,
    ref_logp: Tensor,
    advantage: float,
    clip_eps: float = 0.2,
    kl_beta: float = 0.03,
    clip_eps_high: float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """Token-level clipped-ratio GRPO loss of ONE completion, with the k3 KL penalty; the tutorial's formula.

        loss = -( mean_t min(r_t A, clip(r_t, 1 - eps, 1 + eps_high) A) - kl_beta * mean_t k3_t )

    `clip_eps` is the lower bound's epsilon and, unless `clip_eps_high` is given, the upper one's too; at `r = 1` the
    surrogate's gradient equals REINFORCE's, `-A / T` per token (its value, `-A`, does not). Returns `(loss, stats)`:
    the loss, differentiable w.r.t. `new_logp`, and the floats `loss`, `ratio`, `kl` (k3), `clip_frac` (means).
    Shape: `new_logp`, `old_logp`, `ref_logp`: `[T]`, `T >= 1`, floating point -> loss `[]`.

    Raises:
        ValueError: inputs that are not 1-D floating tensors of one length >= 1, a non-finite advantage, or a negative
            or non-finite `clip_eps`, `clip_eps_high` or `kl_beta`; the message says which.
    """
    _check_logps(new_logp, old_logp, ref_logp)
    advantage = _finite("advantage", advantage)
    eps_low = _non_negative("clip_eps", clip_eps)
    eps_high = eps_low if clip_eps_high is None else _non_negative("clip_eps_high", clip_eps_high)
    beta = _non_negative("kl_beta", kl_beta)

    ratio = importance_ratio(new_logp, old_logp)  # [T]
    surrogate = clipped_surrogate(ratio, advantage, eps_low, eps_high).mean()  # []
    kl = k3_kl(ref_logp, new_logp).mean()  # []
    loss = -(surrogate - beta * kl)
    stats = {
        "loss": float(loss.detach()),
        "ratio": float(ratio.detach().mean()),
        "kl": float(kl.detach()),
        "clip_frac": float(clip_fraction(ratio, eps_low, eps_high)),
    }
    return loss, stats


def grpo_masked_row_losses(
    new_logp: Tensor,
    old_logp: Tensor,
    ref_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_eps: float = 0.2,
    kl_beta: float = 0.03,
    clip_eps_high: float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """`grpo_sample_loss` of every row of a right-padded batch at once, from one batched forward instead of one per row.

    Row b's loss is `grpo_sample_loss(new[b, m_b], old[b, m_b], ref[b, m_b], advantages[b])` with `m_b = mask[b]`, equal
    up to float rounding (a masked sum over a padded row adds its terms in another order than a mean over the unpadded
    row): the law `tests/test_loss.py` checks, values and gradients. Padded positions contribute nothing.

    Shape: `new_logp`, `old_logp`, `ref_logp`, `mask` (bool or 0/1): `[B, T]`, each row with a token; `advantages`:
    `[B]` -> row losses `[B]` (differentiable w.r.t. `new_logp`) and detached per-row `ratio`, `kl`, `clip_frac` `[B]`.

    Raises:
        ValueError: shapes that disagree, a row with no tokens, a non-finite advantage, or a negative or non-finite
            `clip_eps`, `clip_eps_high` or `kl_beta`; the message says which.
    """
    keep = _check_masked(new_logp, old_logp, ref_logp, advantages, mask)
    eps_low = _non_negative("clip_eps", clip_eps)
    eps_high = eps_low if clip_eps_high is None else _non_negative("clip_eps_high", clip_eps_high)
    beta = _non_negative("kl_beta", kl_beta)
    weight = keep.to(new_logp.dtype)  # [B, T]
    tokens = weight.sum(dim=1)  # [B]
    adv = advantages.to(new_logp.dtype).unsqueeze(1)  # [B, 1]
    # Padding is zeroed before exp so a padded position can neither overflow nor send a NaN gradient through the mask.
    new = new_logp.masked_fill(~keep, 0.0)
    old = old_logp.detach().masked_fill(~keep, 0.0)
    ref = ref_logp.detach().masked_fill(~keep, 0.0)
    ratio = importance_ratio(new, old)  # [B, T]
    surrogate = clipped_surrogate(ratio, adv, eps_low, eps_high)  # [B, T]
    kl = k3_kl(ref, new)  # [B, T]
    surrogate_mean = (surrogate * weight).sum(dim=1) / tokens  # [B]
    kl_mean = (kl * weight).sum(dim=1) / tokens  # [B]
    rows = -(surrogate_mean - beta * kl_mean)  # [B]
    with torch.no_grad():
        shifted = ratio - 1.0  # as `clip_fraction` compares, so the two agree at the band's edges
        outside = ((shifted < -eps_low) | (shifted > eps_high)) & keep
        stats = {
            "loss": rows.detach(),
            "ratio": (ratio * weight).sum(dim=1) / tokens,
            "kl": kl_mean.detach(),
            "clip_frac": outside.to(new_logp.dtype).sum(dim=1) / tokens,
        }
    return rows, stats


def grpo_masked_loss(
    new_logp: Tensor,
    old_logp: Tensor,
    ref_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_eps: float = 0.2,
    kl_beta: float = 0.03,
    clip_eps_high: float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """The loss of a right-padded batch of completions: each completion's token-mean loss (`grpo_masked_row_losses`),
    then the mean over completions, and the per-row stats averaged with the same weights. The form the conformance
    suite's `batch_loss` binding takes.

    Every completion weighs the same whatever its length, as in the tutorial and GRPO's `1/G sum_i 1/|o_i| sum_t`. A
    trainer that back-propagates `grpo_sample_loss(...)[0] / B` one completion at a time (to free each graph)
    accumulates the same gradient.

    Shape: `[B, T]` log-probs and mask, `[B]` advantages -> loss `[]`.

    Raises:
        ValueError: what `grpo_masked_row_losses` refuses, an empty batch (B = 0) included.
    """
    rows, stats = grpo_masked_row_losses(
        new_logp, old_logp, ref_logp, advantages, mask, clip_eps=clip_eps, kl_beta=kl_beta, clip_eps_high=clip_eps_high
    )
    loss = rows.mean()
    return loss, {"loss": float(loss.detach()), **{k: float(v.mean()) for k, v in stats.items() if k != "loss"}}


def _check_masked(new_logp: object, old_logp: object, ref_logp: object, advantages: object, mask: object) -> Tensor:
    """The mask as bool after checking every shape; raises ValueError naming what disagrees."""
    for name, t in (("new_logp", new_logp), ("old_logp", old_logp), ("ref_logp", ref_logp)):
        if not isinstance(t, Tensor) or t.dim() != 2 or not t.is_floating_point():
            got = f"shape {tuple(t.shape)} {t.dtype}" if isinstance(t, Tensor) else type(t).__name__
            raise ValueError(f"{name} must be a 2-D floating-point tensor [B, T], got {got}")
    assert isinstance(new_logp, Tensor) and isinstance(old_logp, Tensor) and isinstance(ref_logp, Tensor)
    if not isinstance(mask, Tensor) or not isinstance(advantages, Tensor):
        raise ValueError("mask and advantages must be torch.Tensors ([B, T] and [B])")
    shapes = {"new_logp": new_logp.shape, "old_logp": old_logp.shape, "ref_logp": ref_logp.shape, "mask": mask.shape}
    if len(set(shapes.values())) != 1:
        raise ValueError(
            f"log-probs and mask must share one [B, T] shape, got { ({k: tuple(v) for k, v in shapes.items()}) }"
        )
    if tuple(advantages.shape) != (new_logp.shape[0],):
        raise ValueError(f"advantages must have shape [B] = [{new_logp.shape[0]}], got {tuple(advantages.shape)}")
    if not bool(torch.isfinite(advantages).all()):
        raise ValueError(f"advantages must be finite, got {advantages.tolist()}")
    if new_logp.shape[0] == 0:
        raise ValueError("an empty batch (B = 0): a loss needs at least one completion")
    keep = mask.bool() if mask.dtype == torch.bool else mask > 0
    empty = (~keep.any(dim=1)).nonzero().flatten().tolist()
    if empty:
        raise ValueError(f"rows {empty} of the mask have no tokens; drop empty completions before the loss")
    return keep


def _check_logps(new_logp: object, old_logp: object, ref_logp: object) -> None:
    lengths: dict[str, int] = {}
    for name, t in (("new_logp", new_logp), ("old_logp", old_logp), ("ref_logp", ref_logp)):
        if not isinstance(t, Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 1:
            raise ValueError(f"{name} must be 1-D (one completion's tokens), got shape {tuple(t.shape)}")
        if not t.is_floating_point():
            raise ValueError(f"{name} must be a floating-point tensor, got {t.dtype}")
        lengths[name] = t.shape[0]
    if len(set(lengths.values())) != 1:
        raise ValueError(f"log-prob tensors must have one length, got {lengths}")
    if lengths["new_logp"] < 1:
        raise ValueError("log-prob tensors are empty: a completion needs at least one token")


def _finite(name: str, value: float) -> float:
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return value


def _non_negative(name: str, value: float) -> float:
    value = _finite(name, value)
    if value < 0.0:
        raise ValueError(f"{name} must be >= 0, got {value!r}")
    return value
