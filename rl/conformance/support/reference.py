"""The float64 reference the algorithm laws compare against, computed from an `AlgorithmSpec`, never from the code under
test, and the tolerance each declared dtype earns. Pure Python (`math`, `statistics`, `fractions`), written formula by
formula independently of torch, so a law's expected value is a second computation, not the first one again.

Advantages (DeepSeekMath §4.1.2; Dr. GRPO, Liu et al. 2025): `A_i = (r_i - mean(r_g)) / D_g`. Loss per token of a
completion with advantage A (DeepSeekMath eq. 3; k3, k2: Schulman, "Approximating KL divergence"):

    l_t  = -min(r_t A, clip(r_t, 1 - eps, 1 + eps) A) + kl_beta k(d_t)     r_t = exp(new_t - old_t), d_t = ref_t - new_t
    loss = sum_i sum_t w_i l_it                                          w_i = 1/(B T_i) | 1/(B L) | 1/B | 1/sum_i T_i

Each function states its variant (`D_g`, dual clip, KL clamp, k3_ratio, GSPO, CISPO, the KL's own aggregation); all
of them together, with their sources: docs/conformance.md#the-reference.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import NamedTuple

from rl.conformance.algorithm_spec import MACHINE_EPSILON, SMALLEST_NORMAL, AlgorithmSpec

__all__ = [
    "TOLERANCE_FACTOR",
    "Precision",
    "TokenReference",
    "advantage_denominator",
    "advantage_denominators",
    "advantage_tolerance",
    "invariant_precision",
    "precision",
    "reference_advantages",
    "singleton_advantage",
    "token_reference",
    "token_tolerance",
    "token_weights",
]

TOLERANCE_FACTOR = 4.0
"""How many times the first-order rounding bound a law allows: room for reduction order and fused operations."""


class Precision(NamedTuple):
    """What a dtype resolves: its machine epsilon (relative) and its smallest normal number (absolute)."""

    eps: float
    tiny: float


def precision(dtype: str) -> Precision:
    """The declared dtype's precision: what the choice laws compare to the reference at."""
    return Precision(MACHINE_EPSILON[dtype], SMALLEST_NORMAL[dtype])


def invariant_precision(dtype: str) -> Precision:
    """The precision the invariant laws compare at: the declared dtype's, but never finer than float32's.

    An invariant (zero-sum, permutation, REINFORCE at ratio 1, ...) is broken by far more than rounding when it is
    broken, so comparing at float32 resolution loses no bug, and a float32 implementation declared as float64 then
    fails the choice laws (which compare to the reference at the declared precision), not every invariant."""
    declared = precision(dtype)
    return Precision(max(declared.eps, MACHINE_EPSILON["float32"]), max(declared.tiny, SMALLEST_NORMAL["float32"]))


# -- advantages --------------------------------------------------------------------------------------------------------


def _spread(spec: AlgorithmSpec, rewards: Sequence[float]) -> float:
    """The declared std (population or sample) of `rewards`, correctly rounded from the exact variance; 0 for fewer
    than two (the sample std of one value is 0 here, as NeMo-RL's nan_to_num makes it)."""
    if len(rewards) < 2:
        return 0.0
    variance = (
        statistics.pvariance(rewards) if spec.advantage_scale == "population_std" else statistics.variance(rewards)
    )
    return math.sqrt(variance)


def _from_std(spec: AlgorithmSpec, std: float) -> float:
    """`D` from a std under the declared eps placement."""
    if spec.std_eps_placement == "std":
        return std + spec.std_eps
    if spec.std_eps_placement == "variance":
        return math.sqrt(std * std + spec.std_eps)
    return max(std, spec.std_eps)


def advantage_denominator(spec: AlgorithmSpec, rewards: Sequence[float], batch: Sequence[float] = ()) -> float:
    """`D_g` of a group of two or more rewards under the declared scale, eps and eps placement (for
    `std_scope="batch"`, from the std of `batch`, every reward the function was given), correctly rounded from the
    exact variance. With a leave-one-out baseline each member has its own: see `advantage_denominators`."""
    if spec.advantage_scale == "none":
        return 1.0
    return _from_std(spec, _spread(spec, batch if spec.std_scope == "batch" else rewards))


def advantage_denominators(spec: AlgorithmSpec, rewards: Sequence[float], batch: Sequence[float] = ()) -> list[float]:
    """Each member's `D_i`: the group's (or batch's) `D_g` for every member, or with `advantage_baseline=
    "leave_one_out"` the declared std of the member's others (1 where they all agree: NeMo-RL does not scale them)."""
    if spec.advantage_baseline == "group_mean" or spec.advantage_scale == "none":
        return [advantage_denominator(spec, rewards, batch)] * len(rewards)
    out = []
    for i in range(len(rewards)):
        std = _spread(spec, [r for j, r in enumerate(rewards) if j != i])
        out.append(_from_std(spec, std) if std > 0 else 1.0)
    return out


def singleton_advantage(spec: AlgorithmSpec, reward: float) -> float:
    """The declared advantage of a group of one: 0, or (with "reward") the reward scaled as if the group's mean were 0
    and its std 1 (verl's convention). "refused" has none (the laws never send one): 0.0 here."""
    if spec.singleton_groups != "reward":
        return 0.0
    if spec.advantage_scale == "none":
        return reward
    return reward / _from_std(spec, 1.0)


def reference_advantages(spec: AlgorithmSpec, group_ids: Sequence[int], rewards: Sequence[float]) -> list[float]:
    """Every sample's declared advantage, in input order: exactly 0 for a group whose rewards are all equal (two or
    more of them), the singleton convention for a group of one, and `(r - baseline) / D` otherwise, with
    `r - baseline` exact (rational arithmetic) and one rounding in the division."""
    members: dict[int, list[int]] = {}
    for i, gid in enumerate(group_ids):
        members.setdefault(gid, []).append(i)
    batch = [float(r) for r in rewards]
    out = [0.0] * len(rewards)
    for idx in members.values():
        group = [batch[i] for i in idx]
        if len(group) == 1:
            out[idx[0]] = singleton_advantage(spec, group[0])
            continue
        if all(r == group[0] for r in group):
            continue
        total = sum(map(Fraction, group), Fraction(0))
        denominators = advantage_denominators(spec, group, batch)
        for k, (i, r) in enumerate(zip(idx, group, strict=True)):
            if spec.advantage_baseline == "leave_one_out":
                centred = Fraction(r) - (total - Fraction(r)) / (len(group) - 1)
            else:
                centred = Fraction(r) - total / len(group)
            out[i] = float(centred) / denominators[k] if denominators[k] > 0 else 0.0
    return out


def advantage_tolerance(
    spec: AlgorithmSpec, group: Sequence[float], expected: float, batch: Sequence[float] = ()
) -> float:
    """How far one advantage computed in `spec.advantage_dtype` may be from the reference `expected`.

    Rounding the rewards and their mean costs about `G * eps * max|r|` on `r - mean` (a naive sum of G terms), which the
    denominator divides; the std carries the same relative error into `A`; the division adds `eps * |A|`."""
    eps, tiny = precision(spec.advantage_dtype)
    if len(group) == 1:
        return TOLERANCE_FACTOR * (eps * 2 * abs(expected) + tiny)
    pool = batch if spec.std_scope == "batch" and batch else group
    magnitude = max(abs(r) for r in pool)
    denominator = min(advantage_denominators(spec, group, batch))
    conditioning = len(pool) * magnitude / denominator if denominator > 0 else math.inf
    return TOLERANCE_FACTOR * (eps * (conditioning * (1.0 + abs(expected)) + abs(expected)) + tiny)


# -- the loss ----------------------------------------------------------------------------------------------------------


def token_weights(spec: AlgorithmSpec, lengths: Sequence[int]) -> list[float]:
    """The declared weight `w_i` of each token of completion i (every token of one completion weighs the same), for a
    batch of completions with `lengths` unmasked tokens: the loss is `sum_i sum_t w_i l_it`."""
    batch = len(lengths)
    if spec.loss_aggregation == "sequence_mean":
        return [1.0 / (batch * length) for length in lengths]
    if spec.loss_aggregation == "constant":
        assert spec.loss_normalizer is not None  # AlgorithmSpec checks it
        return [1.0 / (batch * spec.loss_normalizer)] * batch
    if spec.loss_aggregation == "sequence_sum":
        return [1.0 / batch] * batch
    return [1.0 / sum(lengths)] * batch


@dataclass(frozen=True)
class TokenReference:
    """One token's reference: its loss `l_t` and `d l_t / d new_t` (before the aggregation's weight), which side of
    the trust region its ratio is on, and the KL penalty's part of each (kl_beta included), which `kl_aggregation`
    may weigh differently from the rest."""

    value: float
    grad: float
    ratio: float
    side: str
    """"inside" the trust region, "capped" (beyond it on the side that would raise the objective: the gradient is 0;
    for "cispo", a ratio above ratio_cap, whose weight is the cap), "pessimistic" (beyond it on the other side: the
    unclipped term is the minimum and keeps its gradient), or "dual_capped" (A < 0 and the ratio above the declared
    dual clip c: the objective is c A, flat)."""
    magnitude: float
    """The size of the terms that make up `value` and `grad`, each times its conditioning: what rounding scales with."""
    kl_value: float = 0.0
    kl_grad: float = 0.0


def _kl(spec: AlgorithmSpec, new: float, ref: float, ratio: float, kl_beta: float) -> tuple[float, float, float]:
    """`(k, dk/d new, its size)` of the declared estimator, clamp and weight, before kl_beta."""
    delta = ref - new
    if not kl_beta or spec.kl_estimator == "none":
        return 0.0, 0.0, 0.0
    # A log-prob rounded to the dtype is off by eps times its own size, so `ref - new` is off by eps times the inputs'
    # sizes (not the difference's), which `exp` turns into a relative error.
    if spec.kl_estimator == "k2":
        kl, grad = delta * delta / 2, -delta
        size = (abs(delta) + 1.0) * (1.0 + abs(ref) + abs(new))
    else:
        kl, grad = math.expm1(delta) - delta, -math.expm1(delta)
        size = (math.exp(delta) + 1.0) * (1.0 + abs(ref) + abs(new))
    if spec.kl_estimator == "k3_value_k2_grad":  # exp(new - sg(new)) k3: value k3, gradient k3 + dk3 = -d
        grad = -delta
    if spec.kl_clamp is not None and kl > spec.kl_clamp:
        kl, grad = spec.kl_clamp, 0.0
    if spec.kl_estimator == "k3_ratio":  # d(r k)/d new = r k + r dk/d new: the ratio carries a gradient too
        kl, grad, size = ratio * kl, ratio * (kl + grad), ratio * (size + abs(kl))
    return kl, grad, size


def token_reference(
    spec: AlgorithmSpec,
    new: float,
    old: float,
    ref: float,
    advantage: float,
    clip_eps: float,
    kl_beta: float,
    *,
    log_ratio: float | None = None,
) -> TokenReference:
    """One token's reference loss and gradient under the declared importance ratio, KL estimator (k3, k2, k3_ratio,
    k3_value_k2_grad or none), KL clamp and dual clip, in float64. `log_ratio` is the ratio's log for
    `importance_ratio="sequence"` (the completion's mean of `new - old`; each token's gradient is then the whole
    sequence term's, `w T (1/T) d/ds`, which a per-token weight w carries unchanged); `new - old` by default."""
    ratio = math.exp(new - old if log_ratio is None else log_ratio)
    low, high = 1.0 - clip_eps, 1.0 + clip_eps
    if spec.importance_ratio == "cispo":
        assert spec.ratio_cap is not None  # AlgorithmSpec checks it
        weight = min(ratio, spec.ratio_cap)
        side = "capped" if ratio > spec.ratio_cap else "inside"
        surrogate, surrogate_grad = weight * advantage * new, weight * advantage  # the value is a convention
    else:
        if (advantage > 0 and ratio > high) or (advantage < 0 and ratio < low):
            side = "capped"
        elif ratio < low or ratio > high:
            side = "pessimistic"
        else:
            side = "inside"
        clipped = min(max(ratio, low), high)
        surrogate = min(ratio * advantage, clipped * advantage)
        surrogate_grad = 0.0 if side == "capped" else advantage * ratio
        if spec.dual_clip is not None and advantage < 0 and ratio > spec.dual_clip:
            side, surrogate, surrogate_grad = "dual_capped", spec.dual_clip * advantage, 0.0
    kl, kl_grad, kl_size = _kl(spec, new, ref, math.exp(new - old), kl_beta)
    magnitude = abs(advantage) * ratio * (1.0 + abs(new) + abs(old)) + kl_beta * kl_size
    return TokenReference(
        value=-surrogate + kl_beta * kl,
        grad=-surrogate_grad + kl_beta * kl_grad,
        ratio=ratio,
        side=side,
        magnitude=magnitude,
        kl_value=kl_beta * kl,
        kl_grad=kl_beta * kl_grad,
    )


def token_tolerance(at: Precision, weight: float, token: TokenReference) -> float:
    """How far one token's weighted gradient (or weighted loss) computed at precision `at` may be from the
    reference: the rounding of `new - old` and `ref - new`, amplified by `exp`, plus one rounding of each product (and
    a result below the smallest normal number may flush to zero)."""
    return TOLERANCE_FACTOR * (at.eps * abs(weight) * (token.magnitude + abs(token.grad) + abs(token.value)) + at.tiny)
