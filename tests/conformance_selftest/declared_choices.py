"""Correct implementations of the choices real libraries make that `AlgorithmSpec` could not declare before (GSPO,
CISPO, a batch std, a leave-one-out baseline, SkyRL's KL aggregation, NeMo-RL's KL weight, refused groups of one, a
variance floor), each written the way the library it names computes it (the libraries' own code is bound in peers/).

Each is bound twice: `X` under its whole declaration, `X_UNDECLARED` declaring everything it does but the choice under
test, so that only that choice's laws can fail. `K3_VALUE_K2_GRAD_AS_K3_RATIO` is the bug the KL laws missed at ratio
1: NeMo-RL's KL declared as TRL's.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import replace

import torch
from declared_algorithm import _k3, _per_group
from torch import Tensor

from rl.algorithm.advantages import group_normalized_advantages
from rl.algorithm.loss import grpo_sample_loss
from rl.conformance import AlgorithmSpec, Implementation

# -- advantages --------------------------------------------------------------------------------------------------------


def batch_std_advantages(group_ids: Sequence[int], rewards: Sequence[float]) -> list[float]:
    """TRL's `scale_rewards="batch"`: the group's mean, the batch's sample std, `+ 1e-4` (all-equal groups zero)."""
    std = statistics.stdev(rewards) if len(rewards) > 1 else 0.0

    def formula(group: list[float]) -> list[float]:
        mean = statistics.fmean(group)
        return [(r - mean) / (std + 1e-4) for r in group]

    return _per_group(group_ids, rewards, formula)


def leave_one_out_advantages(group_ids: Sequence[int], rewards: Sequence[float]) -> list[float]:
    """NeMo-RL's GRPO estimator: `r_i` less the mean of the others, over the others' sample std `+ 1e-6` where it is
    positive (not scaled where the others all agree); a group of one gets 0 (its baseline is its reward)."""

    def formula(group: list[float]) -> list[float]:
        out = []
        for i, r in enumerate(group):
            others = group[:i] + group[i + 1 :]
            if not others:
                out.append(0.0)
                continue
            baseline = statistics.fmean(others)
            std = statistics.stdev(others) if len(others) > 1 else 0.0
            out.append((r - baseline) / (std + 1e-6) if std > 0 else r - baseline)
        return out

    return _per_group(group_ids, rewards, formula)


def refusing_singleton_advantages(group_ids: Sequence[int], rewards: Sequence[float]) -> list[float]:
    """Ours, refusing a group of one as trainers that always sample `num_generations >= 2` do."""
    if any(list(group_ids).count(gid) == 1 for gid in set(group_ids)):
        raise ValueError("a group of one sample: GRPO needs num_generations >= 2")
    return group_normalized_advantages(group_ids, rewards)


def floor_advantages(group_ids: Sequence[int], rewards: Sequence[float]) -> list[float]:
    """`(r - mean) / max(pstdev, 1e-4)`: the std floored at eps instead of eps added to it."""

    def formula(group: list[float]) -> list[float]:
        if len(group) == 1:
            return [0.0]
        mean = statistics.fmean(group)
        return [(r - mean) / max(statistics.pstdev(group), 1e-4) for r in group]

    return _per_group(group_ids, rewards, formula)


# -- losses ------------------------------------------------------------------------------------------------------------


def _sequence_mean(per_token: Tensor, mask: Tensor) -> Tensor:
    return ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()


def gspo_loss(
    new_logp: Tensor,
    old_logp: Tensor,
    ref_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_eps: float,
    kl_beta: float,
) -> Tensor:
    """GSPO as TRL computes it (`importance_sampling_level="sequence"`, `loss_type="grpo"`): each completion's ratio
    `exp(masked mean of new - old)` clipped two-sided, on every token; k3; per-completion token means, then the mean."""
    log_weight = ((new_logp - old_logp) * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)  # [B]
    ratio = torch.exp(log_weight).unsqueeze(-1)  # [B, 1]
    a = advantages.unsqueeze(-1)  # [B, 1]
    surrogate = torch.minimum(ratio * a, torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps) * a)  # [B, 1]
    return _sequence_mean(-surrogate + kl_beta * _k3(new_logp, ref_logp), mask)


CISPO_CAP = 5.0


def cispo_loss(
    new_logp: Tensor,
    old_logp: Tensor,
    ref_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_eps: float,
    kl_beta: float,
) -> Tensor:
    """CISPO as TRL computes it (`loss_type="cispo"`, `epsilon_high=5.0`): `-sg(min(r, 5)) A new`, then k3; here with
    per-completion token means (TRL divides by the batch's tokens)."""
    weight = torch.clamp(torch.exp(new_logp - old_logp), max=CISPO_CAP).detach()  # [B, T]
    per_token = -weight * advantages.unsqueeze(-1) * new_logp + kl_beta * _k3(new_logp, ref_logp)
    return _sequence_mean(per_token, mask)


def sequence_kl_loss(
    new_logp: Tensor,
    old_logp: Tensor,
    ref_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_eps: float,
    kl_beta: float,
) -> Tensor:
    """SkyRL's: the clipped surrogate over the batch's tokens (`loss_reduction="token_mean"`), the k3 KL as
    `masked_mean(kl, mask, dim=-1).mean()` (each completion's mean, then the mean)."""
    ratio = torch.exp(new_logp - old_logp)
    a = advantages.unsqueeze(-1)
    surrogate = torch.minimum(ratio * a, torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps) * a)
    policy = (-surrogate * mask).sum() / mask.sum().clamp(min=1.0)
    return policy + kl_beta * _sequence_mean(_k3(new_logp, ref_logp), mask)


def k3_value_k2_grad_loss(
    new_logp: Tensor, old_logp: Tensor, ref_logp: Tensor, advantage: float, clip_eps: float = 0.2, kl_beta: float = 0.03
) -> tuple[Tensor, dict[str, float]]:
    """Ours with NeMo-RL's KL weight: k3 times `exp(new - new.detach())`, value 1, so k3's value and k2's gradient."""
    loss, stats = grpo_sample_loss(new_logp, old_logp, ref_logp, advantage, clip_eps, kl_beta=0.0)
    weight = torch.exp(new_logp - new_logp.detach())
    return loss + kl_beta * (weight * _k3(new_logp, ref_logp)).mean(), stats


# -- bound -------------------------------------------------------------------------------------------------------------


def _bind(
    name: str, base: AlgorithmSpec, choice: dict[str, object], **functions: object
) -> tuple[Implementation, Implementation]:
    return (
        Implementation(name=name, algorithm=replace(base, **choice), **functions),  # type: ignore[arg-type]
        Implementation(name=f"{name}-undeclared", algorithm=base, **functions),  # type: ignore[arg-type]
    )


_SAMPLE = AlgorithmSpec(advantage_scale="sample_std")
BATCH_STD, BATCH_STD_UNDECLARED = _bind("batch-std", _SAMPLE, {"std_scope": "batch"}, advantages=batch_std_advantages)
LEAVE_ONE_OUT, LEAVE_ONE_OUT_UNDECLARED = _bind(
    "leave-one-out",
    AlgorithmSpec(advantage_scale="sample_std", std_eps=1e-6),
    {"advantage_baseline": "leave_one_out"},
    advantages=leave_one_out_advantages,
)
REFUSED_SINGLETON, REFUSED_SINGLETON_UNDECLARED = _bind(
    "refused-singleton", AlgorithmSpec(), {"singleton_groups": "refused"}, advantages=refusing_singleton_advantages
)
VARIANCE_FLOOR, VARIANCE_FLOOR_UNDECLARED = _bind(
    "variance-floor", AlgorithmSpec(), {"std_eps_placement": "floor"}, advantages=floor_advantages
)
GSPO, GSPO_UNDECLARED = _bind("gspo", AlgorithmSpec(), {"importance_ratio": "sequence"}, batch_loss=gspo_loss)
CISPO, CISPO_UNDECLARED = _bind(
    "cispo", AlgorithmSpec(), {"importance_ratio": "cispo", "ratio_cap": CISPO_CAP}, batch_loss=cispo_loss
)
SEQUENCE_KL, SEQUENCE_KL_UNDECLARED = _bind(
    "sequence-kl",
    AlgorithmSpec(loss_aggregation="token_mean"),
    {"kl_aggregation": "sequence_mean"},
    batch_loss=sequence_kl_loss,
)
K3_VALUE_K2_GRAD, K3_VALUE_K2_GRAD_UNDECLARED = _bind(
    "k3-value-k2-grad", AlgorithmSpec(), {"kl_estimator": "k3_value_k2_grad"}, sample_loss=k3_value_k2_grad_loss
)
K3_VALUE_K2_GRAD_AS_K3_RATIO = Implementation(
    name="k3-value-k2-grad-as-k3-ratio",
    algorithm=AlgorithmSpec(kl_estimator="k3_ratio", advantage_scale="sample_std"),
    sample_loss=k3_value_k2_grad_loss,
)
"""A KL term that should be weighted by the ratio (declared TRL's k3_ratio) and is not: at ratio 1 both have k3's
value and k2's gradient, so only a ratio away from 1 tells them apart. Its advantage field is one a loss law's message
must leave out."""
