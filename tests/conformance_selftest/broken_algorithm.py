"""Broken GRPO advantages and losses, each a bug a fork can really ship, bound for the packaged suite
(`--rl-impl broken_algorithm:NO_EPS`); `REFERENCE` binds ours. Each broken function is the reference (or the library
computation it names) with one thing changed, and its docstring says what. Those that make another design choice
than ours as well declare it, so that only the bug is left to fail.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from rl.algorithm.advantages import group_normalized_advantages
from rl.algorithm.loss import clipped_surrogate, grpo_sample_loss, importance_ratio, k3_kl
from rl.conformance import AlgorithmSpec, Implementation

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


def sign_flipped_advantages(group_ids: Sequence[int], rewards: Sequence[float]) -> list[float]:
    """`(mean - r) / (std + eps)`: centred and scaled, but the better completion is pushed down."""
    return [-a for a in group_normalized_advantages(group_ids, rewards)]


def tutorial_advantages(group_ids: Sequence[int], rewards: Sequence[float]) -> list[float]:
    """The Flyte tutorial's `(r - fmean) / (pstdev + 1e-4)` with no all-equal guard: the float mean of equal rewards
    can differ from them (`fmean([0.1] * 3) != 0.1`), so a no-signal group gets a 1e-13 residue and the trainer's
    `advantage == 0.0` skip never fires."""

    def formula(rs: list[float]) -> list[float]:
        mean = statistics.fmean(rs)
        std = statistics.pstdev(rs) if len(rs) > 1 else 0.0
        return [(r - mean) / (std + 1e-4) for r in rs]

    return _grouped(group_ids, rewards, formula)


def _float32_group_norm(eps: float, singleton: Callable[[Tensor], Tensor]) -> Callable[..., list[float]]:
    """Group normalisation as the libraries write it, in float32 torch and with no all-equal guard:
    `(r - r.mean()) / (r.std() + eps)` (`torch.std`: the sample std), `singleton(r)` for a group of one."""

    def advantages(group_ids: Sequence[int], rewards: Sequence[float]) -> list[float]:
        values = torch.tensor(list(rewards), dtype=torch.float32)  # [N]
        ids = torch.tensor(list(group_ids), dtype=torch.int64)  # [N]
        out = torch.zeros_like(values)
        for gid in torch.unique(ids):
            members = ids == gid
            group = values[members]  # [G]
            out[members] = singleton(group) if group.numel() == 1 else (group - group.mean()) / (group.std() + eps)
        return out.tolist()

    return advantages


trl_float32_advantages = _float32_group_norm(1e-4, torch.zeros_like)
"""TRL's GRPO advantages (float32, sample std, eps 1e-4): an all-equal group of 0.1s gets same-sign advantages of
about 1e-4 instead of 0 (its float32 mean differs from 0.1, and the std of equal values is rounding noise)."""

openrlhf_float32_advantages = _float32_group_norm(1e-9, torch.zeros_like)
"""OpenRLHF's group normalisation (float32, sample std, eps 1e-9): the same residue over a std of the same size
gives an all-equal group of 0.1s advantages near -0.9."""

verl_float32_advantages = _float32_group_norm(1e-6, lambda group: group / (1.0 + 1e-6))
"""verl's GRPO advantages (float32, sample std, eps 1e-6; a group of one as if its mean were 0 and its std 1): the
singleton convention is declared, and the all-equal groups still break."""


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


def kl_summed_loss(
    new_logp: Tensor, old_logp: Tensor, ref_logp: Tensor, advantage: float, clip_eps: float = 0.2, kl_beta: float = 0.03
) -> tuple[Tensor, dict[str, float]]:
    """The surrogate averaged over tokens but the KL summed: long completions are held to the reference harder."""
    ratio = importance_ratio(new_logp, old_logp)
    surrogate = clipped_surrogate(ratio, advantage, clip_eps, clip_eps).mean()
    return _loss(-(surrogate - kl_beta * k3_kl(ref_logp, new_logp).sum()))


def unmasked_kl_loss(
    new_logp: Tensor,
    old_logp: Tensor,
    ref_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_eps: float,
    kl_beta: float,
) -> Tensor:
    """A batch loss that masks the surrogate but not the KL term: the padding's log-probs enter the loss and get a
    gradient."""
    ratio = torch.exp(new_logp - old_logp)  # [B, T]
    a = advantages.unsqueeze(1)  # [B, 1]
    surrogate = torch.minimum(ratio * a, torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps) * a)
    delta = ref_logp - new_logp
    kl = torch.expm1(delta) - delta
    per_token = -(surrogate * mask) + kl_beta * kl
    return (per_token.sum(dim=1) / mask.sum(dim=1)).mean()


def keepdim_loss(
    new_logp: Tensor, old_logp: Tensor, ref_logp: Tensor, advantage: float, clip_eps: float = 0.2, kl_beta: float = 0.03
) -> tuple[Tensor, dict[str, float]]:
    """The right value and gradient, but of shape `[1]` (a token mean with `keepdim=True`), not a 0-d scalar: a
    trainer stacking it with 0-d losses, or reading `loss.item()` per sample into a `[B]` vector, breaks."""
    ratio = importance_ratio(new_logp, old_logp)
    surrogate = clipped_surrogate(ratio, advantage, clip_eps, clip_eps).mean(dim=-1, keepdim=True)
    return _loss(-(surrogate - kl_beta * k3_kl(ref_logp, new_logp).mean(dim=-1, keepdim=True)))


def one_pass_variance_advantages(group_ids: Sequence[int], rewards: Sequence[float]) -> list[float]:
    """Ours with the variance as `E[r^2] - E[r]^2` (one pass): right for rewards near 0, which the scale hints probe,
    and wrong for rewards near 1e6, where the two terms cancel to rounding noise."""

    def formula(rs: list[float]) -> list[float]:
        if len(set(rs)) == 1:
            return [0.0] * len(rs)
        mean = statistics.fmean(rs)
        variance = max(statistics.fmean(r * r for r in rs) - mean * mean, 0.0)
        return [(r - mean) / (math.sqrt(variance) + EPS) for r in rs]

    return _grouped(group_ids, rewards, formula)


def batch_max_length_loss(
    new_logp: Tensor,
    old_logp: Tensor,
    ref_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_eps: float,
    kl_beta: float,
) -> Tensor:
    """Dr. GRPO's constant normaliser taken from the batch, `B * max(T_i)`, instead of a constant: the loss scale then
    depends on the batch's longest completion."""
    ratio = importance_ratio(new_logp, old_logp)
    surrogate = clipped_surrogate(ratio, advantages.unsqueeze(1), clip_eps, clip_eps)  # [B, T]
    per_token = -surrogate + kl_beta * k3_kl(ref_logp, new_logp)
    return (per_token * mask).sum() / (mask.shape[0] * mask.sum(dim=1).max())


# -- bound -------------------------------------------------------------------------------------------------------------

REFERENCE = Implementation(
    name="reference-algorithm", advantages=group_normalized_advantages, sample_loss=grpo_sample_loss
)

NO_EPS = Implementation(name="no-eps", advantages=no_eps_advantages)
NOT_CENTRED = Implementation(name="not-centred", advantages=not_centred_advantages)
BATCH_STD = Implementation(name="batch-std", advantages=batch_std_advantages)
CONTIGUOUS_GROUPS = Implementation(name="contiguous-groups", advantages=contiguous_group_advantages)
SORTED_BY_GROUP = Implementation(name="sorted-by-group", advantages=sorted_by_group_advantages)
SIGN_FLIPPED = Implementation(name="sign-flipped", advantages=sign_flipped_advantages)
TUTORIAL = Implementation(name="tutorial", advantages=tutorial_advantages)
_SAMPLE_STD_FLOAT32 = AlgorithmSpec(advantage_scale="sample_std", advantage_dtype="float32")
TRL_FLOAT32 = Implementation(name="trl-float32", advantages=trl_float32_advantages, algorithm=_SAMPLE_STD_FLOAT32)
OPENRLHF_FLOAT32 = Implementation(
    name="openrlhf-float32",
    advantages=openrlhf_float32_advantages,
    algorithm=AlgorithmSpec(advantage_scale="sample_std", advantage_dtype="float32", std_eps=1e-9),
)
VERL_FLOAT32 = Implementation(
    name="verl-float32",
    advantages=verl_float32_advantages,
    algorithm=AlgorithmSpec(
        advantage_scale="sample_std", advantage_dtype="float32", std_eps=1e-6, singleton_groups="reward"
    ),
)

KL_SIGN_FLIPPED = Implementation(name="kl-sign-flipped", sample_loss=kl_sign_flipped_loss)
K1_KL = Implementation(name="k1-kl", sample_loss=k1_kl_loss)
UNCLIPPED_RATIO = Implementation(name="unclipped-ratio", sample_loss=unclipped_ratio_loss)
CLAMP_ONLY = Implementation(name="clamp-only", sample_loss=clamp_only_loss)
ADVANTAGE_SIGN_FLIPPED = Implementation(name="advantage-sign-flipped", sample_loss=advantage_sign_flipped_loss)
KL_SUMMED = Implementation(name="kl-summed", sample_loss=kl_summed_loss)
UNMASKED_KL = Implementation(name="unmasked-kl", batch_loss=unmasked_kl_loss)
KEEPDIM = Implementation(name="keepdim", sample_loss=keepdim_loss)
ONE_PASS_VARIANCE = Implementation(name="one-pass-variance", advantages=one_pass_variance_advantages)
BATCH_MAX_LENGTH = Implementation(name="batch-max-length", batch_loss=batch_max_length_loss)
