"""Broken GRPO advantages and losses, each a bug a fork can really ship, bound for the packaged suite
(`--rl-impl broken_algorithm:SAMPLE_STD`); `REFERENCE` binds ours. Each broken function is the reference with one
thing changed, and its docstring says what.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from rl.advantages import group_normalized_advantages
from rl.conformance import Implementation
from rl.loss import clipped_surrogate, grpo_sample_loss, importance_ratio, k3_kl

EPS = 1e-4

GroupFormula = Callable[[list[float]], list[float]]


def _grouped(group_ids: Sequence[int], rewards: Sequence[float], formula: GroupFormula) -> list[float]:
    """Apply `formula` to each group's rewards (members in input order) and put the results back in input order."""
    members: dict[int, list[int]] = {}
    for i, gid in enumerate(group_ids):
        members.setdefault(gid, []).append(i)
    out = [0.0] * len(rewards)
    for idx in members.values():
        for i, a in zip(idx, formula([rewards[i] for i in idx]), strict=True):
            out[i] = a
    return out


def _ieee_div(x: float, y: float) -> float:
    """`x / y` as numpy or torch divide: 0/0 is NaN and x/0 is ±inf, not a ZeroDivisionError."""
    if y == 0.0:
        return math.nan if x == 0.0 else math.copysign(math.inf, x)
    return x / y


def _standardised(rs: list[float], std: float) -> list[float]:
    if len(set(rs)) == 1:
        return [0.0] * len(rs)
    mean = statistics.fmean(rs)
    return [(r - mean) / (std + EPS) for r in rs]


# -- advantages --------------------------------------------------------------------------------------------------------


def sample_std_advantages(group_ids: Sequence[int], rewards: Sequence[float]) -> list[float]:
    """`statistics.stdev` (n - 1) where GRPO divides by the population std (n), as `torch.std` does by default."""
    return _grouped(group_ids, rewards, lambda rs: _standardised(rs, statistics.stdev(rs) if len(rs) > 1 else 0.0))


def no_eps_advantages(group_ids: Sequence[int], rewards: Sequence[float]) -> list[float]:
    """`(r - mean) / std` without eps and without the all-equal guard, divided the way numpy does: an all-equal group
    gives 0/0 = NaN (or ±inf where the float mean differs from the rewards by rounding)."""

    def formula(rs: list[float]) -> list[float]:
        mean, std = statistics.fmean(rs), statistics.pstdev(rs)
        return [_ieee_div(r - mean, std) for r in rs]

    return _grouped(group_ids, rewards, formula)


def not_centred_advantages(group_ids: Sequence[int], rewards: Sequence[float]) -> list[float]:
    """`r / (std + eps)`: the mean is never subtracted, so a group of all-correct answers still pushes them up."""

    def formula(rs: list[float]) -> list[float]:
        if len(set(rs)) == 1:
            return [0.0] * len(rs)
        return [r / (statistics.pstdev(rs) + EPS) for r in rs]

    return _grouped(group_ids, rewards, formula)


def batch_std_advantages(group_ids: Sequence[int], rewards: Sequence[float]) -> list[float]:
    """The group's mean, but the whole batch's std: a group's advantages then depend on the other groups' rewards."""
    batch_std = statistics.pstdev(rewards) if rewards else 0.0
    return _grouped(group_ids, rewards, lambda rs: _standardised(rs, batch_std))


def contiguous_group_advantages(group_ids: Sequence[int], rewards: Sequence[float]) -> list[float]:
    """Groups found with `itertools.groupby`, which assumes a group's samples are contiguous (as a `[B, G]` reshape
    does): interleaved samples of one group become several groups."""
    out: list[float] = []
    for _, run in itertools.groupby(range(len(rewards)), key=lambda i: group_ids[i]):
        rs = [rewards[i] for i in run]
        out += _standardised(rs, statistics.pstdev(rs))
    return out


def sorted_by_group_advantages(group_ids: Sequence[int], rewards: Sequence[float]) -> list[float]:
    """Sorts the samples by group id to make the groups contiguous, and returns the advantages in that sorted order
    instead of the input order."""
    order = sorted(range(len(rewards)), key=lambda i: group_ids[i])
    return group_normalized_advantages([group_ids[i] for i in order], [rewards[i] for i in order])


# -- the loss ----------------------------------------------------------------------------------------------------------


def _loss(loss: Tensor) -> tuple[Tensor, dict[str, float]]:
    return loss, {"loss": float(loss.detach())}


def kl_sign_flipped_loss(
    new_logp: Tensor, old_logp: Tensor, ref_logp: Tensor, advantage: float, clip_eps: float = 0.2, kl_beta: float = 0.03
) -> tuple[Tensor, dict[str, float]]:
    """`-(surrogate + kl_beta * kl)`: the KL penalty enters as a bonus, pushing the policy away from the reference."""
    ratio = importance_ratio(new_logp, old_logp)
    surrogate = clipped_surrogate(ratio, advantage, clip_eps, clip_eps).mean()
    return _loss(-(surrogate + kl_beta * k3_kl(ref_logp, new_logp).mean()))


def k1_kl_loss(
    new_logp: Tensor, old_logp: Tensor, ref_logp: Tensor, advantage: float, clip_eps: float = 0.2, kl_beta: float = 0.03
) -> tuple[Tensor, dict[str, float]]:
    """The k1 estimator `mean(new - ref)` in place of k3: unbiased in expectation, but negative on a token where new <
    ref and with gradient kl_beta / T everywhere, so on one sample it pulls every token down, not towards ref."""
    ratio = importance_ratio(new_logp, old_logp)
    surrogate = clipped_surrogate(ratio, advantage, clip_eps, clip_eps).mean()
    return _loss(-(surrogate - kl_beta * (new_logp - ref_logp.detach()).mean()))


def unclipped_ratio_loss(
    new_logp: Tensor, old_logp: Tensor, ref_logp: Tensor, advantage: float, clip_eps: float = 0.2, kl_beta: float = 0.03
) -> tuple[Tensor, dict[str, float]]:
    """`-(mean(r A) - kl_beta * kl)`: the ratio is never clipped, so a stale sample pushes without a trust region."""
    ratio = importance_ratio(new_logp, old_logp)
    return _loss(-((ratio * advantage).mean() - kl_beta * k3_kl(ref_logp, new_logp).mean()))


def clamp_only_loss(
    new_logp: Tensor, old_logp: Tensor, ref_logp: Tensor, advantage: float, clip_eps: float = 0.2, kl_beta: float = 0.03
) -> tuple[Tensor, dict[str, float]]:
    """`clip(r) A` without PPO's `min(r A, clip(r) A)`: the gradient is also cut where the clip is on the side that
    lowers the objective, so a move that made a good answer much less likely is never corrected."""
    ratio = importance_ratio(new_logp, old_logp)
    surrogate = (torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps) * advantage).mean()
    return _loss(-(surrogate - kl_beta * k3_kl(ref_logp, new_logp).mean()))


def advantage_sign_flipped_loss(
    new_logp: Tensor, old_logp: Tensor, ref_logp: Tensor, advantage: float, clip_eps: float = 0.2, kl_beta: float = 0.03
) -> tuple[Tensor, dict[str, float]]:
    """`surrogate + kl_beta * kl`: the objective is returned as the loss, so gradient descent makes good answers less
    likely (the KL penalty keeps its correct sign)."""
    ratio = importance_ratio(new_logp, old_logp)
    surrogate = clipped_surrogate(ratio, advantage, clip_eps, clip_eps).mean()
    return _loss(surrogate + kl_beta * k3_kl(ref_logp, new_logp).mean())


def token_sum_loss(
    new_logp: Tensor, old_logp: Tensor, ref_logp: Tensor, advantage: float, clip_eps: float = 0.2, kl_beta: float = 0.03
) -> tuple[Tensor, dict[str, float]]:
    """Sums over tokens instead of averaging: a completion weighs in proportion to its length."""
    ratio = importance_ratio(new_logp, old_logp)
    surrogate = clipped_surrogate(ratio, advantage, clip_eps, clip_eps).sum()
    return _loss(-(surrogate - kl_beta * k3_kl(ref_logp, new_logp).sum()))


def kl_summed_loss(
    new_logp: Tensor, old_logp: Tensor, ref_logp: Tensor, advantage: float, clip_eps: float = 0.2, kl_beta: float = 0.03
) -> tuple[Tensor, dict[str, float]]:
    """The surrogate averaged over tokens but the KL summed: long completions are held to the reference harder."""
    ratio = importance_ratio(new_logp, old_logp)
    surrogate = clipped_surrogate(ratio, advantage, clip_eps, clip_eps).mean()
    return _loss(-(surrogate - kl_beta * k3_kl(ref_logp, new_logp).sum()))


def keepdim_loss(
    new_logp: Tensor, old_logp: Tensor, ref_logp: Tensor, advantage: float, clip_eps: float = 0.2, kl_beta: float = 0.03
) -> tuple[Tensor, dict[str, float]]:
    """The right value and gradient, but of shape `[1]` (a token mean with `keepdim=True`), not a 0-d scalar: a
    trainer stacking it with 0-d losses, or reading `loss.item()` per sample into a `[B]` vector, breaks."""
    ratio = importance_ratio(new_logp, old_logp)
    surrogate = clipped_surrogate(ratio, advantage, clip_eps, clip_eps).mean(dim=-1, keepdim=True)
    return _loss(-(surrogate - kl_beta * k3_kl(ref_logp, new_logp).mean(dim=-1, keepdim=True)))


# -- bound -------------------------------------------------------------------------------------------------------------

REFERENCE = Implementation(
    name="reference-algorithm", advantages=group_normalized_advantages, sample_loss=grpo_sample_loss
)

SAMPLE_STD = Implementation(name="sample-std", advantages=sample_std_advantages)
NO_EPS = Implementation(name="no-eps", advantages=no_eps_advantages)
NOT_CENTRED = Implementation(name="not-centred", advantages=not_centred_advantages)
BATCH_STD = Implementation(name="batch-std", advantages=batch_std_advantages)
CONTIGUOUS_GROUPS = Implementation(name="contiguous-groups", advantages=contiguous_group_advantages)
SORTED_BY_GROUP = Implementation(name="sorted-by-group", advantages=sorted_by_group_advantages)

KL_SIGN_FLIPPED = Implementation(name="kl-sign-flipped", sample_loss=kl_sign_flipped_loss)
K1_KL = Implementation(name="k1-kl", sample_loss=k1_kl_loss)
UNCLIPPED_RATIO = Implementation(name="unclipped-ratio", sample_loss=unclipped_ratio_loss)
CLAMP_ONLY = Implementation(name="clamp-only", sample_loss=clamp_only_loss)
ADVANTAGE_SIGN_FLIPPED = Implementation(name="advantage-sign-flipped", sample_loss=advantage_sign_flipped_loss)
TOKEN_SUM = Implementation(name="token-sum", sample_loss=token_sum_loss)
KL_SUMMED = Implementation(name="kl-summed", sample_loss=kl_summed_loss)
KEEPDIM = Implementation(name="keepdim", sample_loss=keepdim_loss)
