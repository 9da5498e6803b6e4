"""Correct GRPO advantages and losses that make another design choice than ours, each bound twice for the packaged
suite: under its true declaration (`SAMPLE_STD`), and undeclared, under the default `AlgorithmSpec()`
(`SAMPLE_STD_UNDECLARED`). Each is written the way the library it names computes it, with the one guard the laws
require of everyone (an all-equal group gives exact zeros).

`OURS_*` bind our own functions under the other declarations they support.
"""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Sequence

import torch
from torch import Tensor

from rl.algorithm.advantages import group_normalized_advantages
from rl.algorithm.loss import grpo_sample_loss
from rl.conformance import AlgorithmSpec, Implementation

# -- advantages --------------------------------------------------------------------------------------------------------


def _per_group(group_ids: Sequence[int], rewards: Sequence[float], formula) -> list[float]:  # type: ignore[no-untyped-def]
    members: dict[int, list[int]] = {}
    for i, gid in enumerate(group_ids):
        members.setdefault(gid, []).append(i)
    out = [0.0] * len(rewards)
    for idx in members.values():
        group = [float(rewards[i]) for i in idx]
        if len(group) > 1 and len(set(group)) == 1:
            continue  # no signal: exact zeros
        for i, a in zip(idx, formula(group), strict=True):
            out[i] = a
    return out


def sample_std_advantages(group_ids: Sequence[int], rewards: Sequence[float]) -> list[float]:
    """`(r - mean) / (stdev + 1e-4)`, the sample std (n - 1) as `torch.std` computes it by default (TRL, OpenRLHF)."""

    def formula(group: list[float]) -> list[float]:
        if len(group) == 1:
            return [0.0]
        mean, std = statistics.fmean(group), statistics.stdev(group)
        return [(r - mean) / (std + 1e-4) for r in group]

    return _per_group(group_ids, rewards, formula)


def variance_eps_advantages(group_ids: Sequence[int], rewards: Sequence[float]) -> list[float]:
    """`(r - mean) / sqrt(pvariance + 1e-4)`: eps inside the square root, as a batch-norm layer adds it."""

    def formula(group: list[float]) -> list[float]:
        if len(group) == 1:
            return [0.0]
        mean = statistics.fmean(group)
        return [(r - mean) / math.sqrt(statistics.pvariance(group) + 1e-4) for r in group]

    return _per_group(group_ids, rewards, formula)


def singleton_reward_advantages(group_ids: Sequence[int], rewards: Sequence[float]) -> list[float]:
    """Ours, except that a group of one is scaled as if its mean were 0 and its std 1 (verl): `r / (1 + 1e-4)`."""

    def formula(group: list[float]) -> list[float]:
        mean, std = (0.0, 1.0) if len(group) == 1 else (statistics.fmean(group), statistics.pstdev(group))
        return [(r - mean) / (std + 1e-4) for r in group]

    return _per_group(group_ids, rewards, formula)


def float32_advantages(group_ids: Sequence[int], rewards: Sequence[float]) -> list[float]:
    """Ours in float32 torch, as a trainer holding its rewards in a float32 tensor computes them: the population std
    (`unbiased=False`) plus 1e-4, and exact zeros where a group's float32 rewards are all equal."""
    values = torch.tensor(list(rewards), dtype=torch.float32)  # [N]
    ids = torch.tensor(list(group_ids), dtype=torch.int64)  # [N]
    out = torch.zeros_like(values)
    for gid in torch.unique(ids):
        members = ids == gid
        group = values[members]  # [G]
        if group.numel() == 1 or bool((group == group[0]).all()):
            continue
        out[members] = (group - group.mean()) / (group.std(unbiased=False) + 1e-4)
    return out.tolist()


# -- losses ------------------------------------------------------------------------------------------------------------


def _per_token(new: Tensor, old: Tensor, ref: Tensor, advantages: Tensor, clip_eps: float, kl_beta: float) -> Tensor:
    """TRL's per-token GRPO loss: `-(min(r A, clip(r) A) - kl_beta k3)`. Shape: `[B, T]`, `advantages` `[B]`."""
    ratio = torch.exp(new - old)  # [B, T]
    a = advantages.unsqueeze(1)  # [B, 1]
    surrogate = torch.minimum(ratio * a, torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps) * a)
    delta = ref - new
    return -(surrogate - kl_beta * (torch.exp(delta) - delta - 1))


def constant_normalizer_loss(
    new_logp: Tensor,
    old_logp: Tensor,
    ref_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_eps: float,
    kl_beta: float,
) -> Tensor:
    """Dr. GRPO's aggregation (TRL's `loss_type="dr_grpo"`): the masked token sum over `B * max_completion_length`."""
    per_token = _per_token(new_logp, old_logp, ref_logp, advantages, clip_eps, kl_beta)
    return (per_token * mask).sum() / (per_token.size(0) * MAX_COMPLETION_LENGTH)


MAX_COMPLETION_LENGTH = 128


def token_mean_loss(
    new_logp: Tensor,
    old_logp: Tensor,
    ref_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_eps: float,
    kl_beta: float,
) -> tuple[Tensor, dict[str, float]]:
    """DAPO's token-level mean (TRL's `loss_type="dapo"`): the masked token sum over the batch's token count."""
    per_token = _per_token(new_logp, old_logp, ref_logp, advantages, clip_eps, kl_beta)
    loss = (per_token * mask).sum() / mask.sum().clamp(min=1.0)
    return loss, {"loss": float(loss.detach())}


def sequence_sum_loss(
    new_logp: Tensor, old_logp: Tensor, ref_logp: Tensor, advantage: float, clip_eps: float = 0.2, kl_beta: float = 0.03
) -> tuple[Tensor, dict[str, float]]:
    """Ours summed over a completion's tokens instead of averaged: `T` times `grpo_sample_loss`."""
    loss, stats = grpo_sample_loss(new_logp, old_logp, ref_logp, advantage, clip_eps, kl_beta)
    return loss * new_logp.shape[0], stats


def on_policy_loss(
    new_logp: Tensor,
    old_logp: Tensor,
    ref_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_eps: float,
    kl_beta: float,
) -> Tensor:
    """TRL with one PPO epoch: old_logp is `new_logp.detach()` (it ignores the one it is given), so the ratio is 1 by
    construction; per-sequence token means, then the batch mean."""
    per_token = _per_token(new_logp, new_logp.detach(), ref_logp, advantages, clip_eps, kl_beta)
    return ((per_token * mask).sum(dim=1) / mask.sum(dim=1)).mean()


def k2_loss(
    new_logp: Tensor, old_logp: Tensor, ref_logp: Tensor, advantage: float, clip_eps: float = 0.2, kl_beta: float = 0.03
) -> tuple[Tensor, dict[str, float]]:
    """Ours with Schulman's k2, `(ref - new)^2 / 2`, for the KL penalty."""
    ratio = torch.exp(new_logp - old_logp)
    surrogate = torch.minimum(ratio * advantage, torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps) * advantage).mean()
    loss = -(surrogate - kl_beta * ((ref_logp - new_logp) ** 2 / 2).mean())
    return loss, {"loss": float(loss.detach())}


def _sample_loss(surrogate: Tensor, kl: Tensor, kl_beta: float) -> tuple[Tensor, dict[str, float]]:
    loss = -(surrogate - kl_beta * kl).mean()
    return loss, {"loss": float(loss.detach())}


def _k3(new_logp: Tensor, ref_logp: Tensor) -> Tensor:
    delta = ref_logp - new_logp
    return torch.exp(delta) - delta - 1


DUAL_CLIP_C = 3.0


def _clipped_surrogate(new_logp: Tensor, old_logp: Tensor, advantage: float, clip_eps: float) -> tuple[Tensor, Tensor]:
    """`(ratio, min(r A, clip(r, 1 - eps, 1 + eps) A))` per token. Shape: `[T]` -> `[T]`, `[T]`."""
    ratio = torch.exp(new_logp - old_logp)
    return ratio, torch.minimum(ratio * advantage, torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps) * advantage)


def dual_clip_loss(
    new_logp: Tensor, old_logp: Tensor, ref_logp: Tensor, advantage: float, clip_eps: float = 0.2, kl_beta: float = 0.03
) -> tuple[Tensor, dict[str, float]]:
    """Ours with verl's dual clip (`clip_ratio_c=3`): for A < 0 the objective is `max(min(r A, clip(r) A), 3 A)`."""
    _, surrogate = _clipped_surrogate(new_logp, old_logp, advantage, clip_eps)
    if advantage < 0:
        surrogate = torch.clamp(surrogate, min=DUAL_CLIP_C * advantage)
    return _sample_loss(surrogate, _k3(new_logp, ref_logp), kl_beta)


def k3_ratio_loss(
    new_logp: Tensor, old_logp: Tensor, ref_logp: Tensor, advantage: float, clip_eps: float = 0.2, kl_beta: float = 0.03
) -> tuple[Tensor, dict[str, float]]:
    """Ours with TRL's bias-corrected KL (`use_bias_correction_kl=True`): k3 times the ratio, not detached."""
    ratio, surrogate = _clipped_surrogate(new_logp, old_logp, advantage, clip_eps)
    return _sample_loss(surrogate, ratio * _k3(new_logp, ref_logp), kl_beta)


def clamped_kl_loss(
    new_logp: Tensor, old_logp: Tensor, ref_logp: Tensor, advantage: float, clip_eps: float = 0.2, kl_beta: float = 0.03
) -> tuple[Tensor, dict[str, float]]:
    """Ours with verl's `low_var_kl` clamp: each token's k3 at most 10."""
    _, surrogate = _clipped_surrogate(new_logp, old_logp, advantage, clip_eps)
    return _sample_loss(surrogate, torch.clamp(_k3(new_logp, ref_logp), max=10.0), kl_beta)


def no_kl_loss(
    new_logp: Tensor, old_logp: Tensor, ref_logp: Tensor, advantage: float, clip_eps: float = 0.2, kl_beta: float = 0.03
) -> tuple[Tensor, dict[str, float]]:
    """Ours without the KL term (TRL's default `beta=0.0` builds no reference model): kl_beta is ignored."""
    return grpo_sample_loss(new_logp, old_logp, ref_logp, advantage, clip_eps, kl_beta=0.0)


def float32_loss(
    new_logp: Tensor, old_logp: Tensor, ref_logp: Tensor, advantage: float, clip_eps: float = 0.2, kl_beta: float = 0.03
) -> tuple[Tensor, dict[str, float]]:
    """Ours on float32 copies of its inputs, as a trainer in float32 computes it (the gradient flows back through the
    cast)."""
    return grpo_sample_loss(new_logp.float(), old_logp.float(), ref_logp.float(), advantage, clip_eps, kl_beta)


# -- bound -------------------------------------------------------------------------------------------------------------


def _bind(name: str, spec: AlgorithmSpec, **functions: object) -> tuple[Implementation, Implementation]:
    return (
        Implementation(name=name, algorithm=spec, **functions),  # type: ignore[arg-type]
        Implementation(name=f"{name}-undeclared", **functions),  # type: ignore[arg-type]
    )


SAMPLE_STD, SAMPLE_STD_UNDECLARED = _bind(
    "sample-std", AlgorithmSpec(advantage_scale="sample_std"), advantages=sample_std_advantages
)
DR_GRPO, DR_GRPO_UNDECLARED = _bind(
    "dr-grpo",
    AlgorithmSpec(advantage_scale="none"),
    advantages=functools.partial(group_normalized_advantages, scale="none"),
)
EPS_1E6, EPS_1E6_UNDECLARED = _bind(
    "eps-1e-6", AlgorithmSpec(std_eps=1e-6), advantages=functools.partial(group_normalized_advantages, eps=1e-6)
)
VARIANCE_EPS, VARIANCE_EPS_UNDECLARED = _bind(
    "variance-eps", AlgorithmSpec(std_eps_placement="variance"), advantages=variance_eps_advantages
)
SINGLETON_REWARD, SINGLETON_REWARD_UNDECLARED = _bind(
    "singleton-reward", AlgorithmSpec(singleton_groups="reward"), advantages=singleton_reward_advantages
)
FLOAT32_ADVANTAGES, FLOAT32_ADVANTAGES_UNDECLARED = _bind(
    "float32-advantages", AlgorithmSpec(advantage_dtype="float32"), advantages=float32_advantages
)
CONSTANT_NORMALIZER, CONSTANT_NORMALIZER_UNDECLARED = _bind(
    "constant-normalizer",
    AlgorithmSpec(loss_aggregation="constant", loss_normalizer=MAX_COMPLETION_LENGTH),
    batch_loss=constant_normalizer_loss,
)
SEQUENCE_SUM, SEQUENCE_SUM_UNDECLARED = _bind(
    "sequence-sum", AlgorithmSpec(loss_aggregation="sequence_sum"), sample_loss=sequence_sum_loss
)
TOKEN_MEAN = Implementation(
    name="token-mean", algorithm=AlgorithmSpec(loss_aggregation="token_mean"), batch_loss=token_mean_loss
)
TOKEN_MEAN_UNDECLARED = Implementation(name="token-mean-undeclared", batch_loss=token_mean_loss)
K2, K2_UNDECLARED = _bind("k2", AlgorithmSpec(kl_estimator="k2"), sample_loss=k2_loss)
DUAL_CLIP, DUAL_CLIP_UNDECLARED = _bind("dual-clip", AlgorithmSpec(dual_clip=DUAL_CLIP_C), sample_loss=dual_clip_loss)
K3_RATIO, K3_RATIO_UNDECLARED = _bind("k3-ratio", AlgorithmSpec(kl_estimator="k3_ratio"), sample_loss=k3_ratio_loss)
KL_CLAMP, KL_CLAMP_UNDECLARED = _bind("kl-clamp", AlgorithmSpec(kl_clamp=10.0), sample_loss=clamped_kl_loss)
NO_KL, NO_KL_UNDECLARED = _bind("no-kl", AlgorithmSpec(kl_estimator="none"), sample_loss=no_kl_loss)
ON_POLICY, ON_POLICY_UNDECLARED = _bind(
    "on-policy", AlgorithmSpec(importance_ratio="on_policy"), batch_loss=on_policy_loss
)
FLOAT32_LOSS, FLOAT32_LOSS_UNDECLARED = _bind(
    "float32-loss", AlgorithmSpec(loss_dtype="float32"), sample_loss=float32_loss
)

# Our own functions under the other declarations they support.
OURS_UNSCALED = DR_GRPO
OURS_EPS_1E6 = EPS_1E6
OURS_NO_KL = Implementation(
    name="ours-no-kl", algorithm=AlgorithmSpec(kl_estimator="none"), sample_loss=grpo_sample_loss
)
OURS_ON_POLICY = Implementation(
    name="ours-on-policy", algorithm=AlgorithmSpec(importance_ratio="on_policy"), sample_loss=grpo_sample_loss
)
OURS_FLOAT32 = Implementation(
    name="ours-float32",
    algorithm=AlgorithmSpec(loss_dtype="float32", advantage_dtype="float32"),
    advantages=group_normalized_advantages,
    sample_loss=grpo_sample_loss,
)
OURS_BFLOAT16 = Implementation(
    name="ours-bfloat16", algorithm=AlgorithmSpec(loss_dtype="bfloat16"), sample_loss=grpo_sample_loss
)
