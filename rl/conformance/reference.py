"""The float64 reference the algorithm laws compare against, computed from an `AlgorithmSpec`, never from the code under
test, and the tolerance each declared dtype earns.

Pure Python (`math`, `statistics`, `fractions`): written out formula by formula, independently of torch, so a law's
expected value is a second computation, not the first one again.

Advantages (DeepSeekMath §4.1.2; Dr. GRPO, Liu et al. 2025):

    A_i = (r_i - mean(r_g)) / D_g       D_g = std_g + eps | sqrt(var_g + eps) | 1   (std: population or sample)

Loss, per token of a completion with advantage A (DeepSeekMath eq. 3; k3 and k2 from Schulman, "Approximating KL
divergence"), and its aggregation over a batch of B completions of lengths T_i:

    l_t  = -min(r_t A, clip(r_t, 1 - eps, 1 + eps) A) + kl_beta k(d_t)     r_t = exp(new_t - old_t), d_t = ref_t - new_t

(with a dual clip c, for A < 0: -max(min(...), c A); with a KL clamp C: min(k, C); k3_ratio: r_t k3(d_t)),
    loss = sum_i sum_t w_i l_it                                          w_i = 1/(B T_i) | 1/(B L) | 1/B | 1/sum_i T_i
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import NamedTuple

from rl.conformance.spec import MACHINE_EPSILON, SMALLEST_NORMAL, AlgorithmSpec

__all__ = [
    "TOLERANCE_FACTOR",
    "Precision",
    "TokenReference",
    "advantage_denominator",
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


def advantage_denominator(spec: AlgorithmSpec, rewards: Sequence[float]) -> float:
    """`D_g` of a group of two or more rewards under the declared scale, eps and eps placement, correctly rounded from
    the exact variance."""
    if spec.advantage_scale == "none":
        return 1.0
    if spec.advantage_scale == "population_std":
        variance = statistics.pvariance(rewards)
    else:
        variance = statistics.variance(rewards)
    if spec.std_eps_placement == "std":
        return math.sqrt(variance) + spec.std_eps
    return math.sqrt(variance + spec.std_eps)


def singleton_advantage(spec: AlgorithmSpec, reward: float) -> float:
    """The declared advantage of a group of one: 0, or (with "reward") the reward scaled as if the group's mean were 0
    and its std 1 (verl's convention)."""
    if spec.singleton_groups == "zero":
        return 0.0
    if spec.advantage_scale == "none":
        return reward
    unit = 1.0 + spec.std_eps if spec.std_eps_placement == "std" else math.sqrt(1.0 + spec.std_eps)
    return reward / unit


def reference_advantages(spec: AlgorithmSpec, group_ids: Sequence[int], rewards: Sequence[float]) -> list[float]:
    """Every sample's declared advantage, in input order: exactly 0 for a group whose rewards are all equal (two or
    more of them), the singleton convention for a group of one, and `(r - mean) / D_g` otherwise, with `r - mean`
    exact (rational arithmetic) and one rounding in the division."""
    members: dict[int, list[int]] = {}
    for i, gid in enumerate(group_ids):
        members.setdefault(gid, []).append(i)
    out = [0.0] * len(rewards)
    for idx in members.values():
        group = [float(rewards[i]) for i in idx]
        if len(group) == 1:
            out[idx[0]] = singleton_advantage(spec, group[0])
            continue
        if all(r == group[0] for r in group):
            continue
        mean = sum(map(Fraction, group)) / len(group)
        denominator = advantage_denominator(spec, group)
        for i, r in zip(idx, group, strict=True):
            out[i] = float(Fraction(r) - mean) / denominator if denominator > 0 else 0.0
    return out


def advantage_tolerance(spec: AlgorithmSpec, group: Sequence[float], expected: float) -> float:
    """How far one advantage computed in `spec.advantage_dtype` may be from the reference `expected`.

    Rounding the rewards and their mean costs about `G * eps * max|r|` on `r - mean` (a naive sum of G terms), which the
    denominator divides; the std carries the same relative error into `A`; the division adds `eps * |A|`."""
    eps, tiny = precision(spec.advantage_dtype)
    if len(group) == 1:
        return TOLERANCE_FACTOR * (eps * 2 * abs(expected) + tiny)
    magnitude = max(abs(r) for r in group)
    denominator = advantage_denominator(spec, group)
    conditioning = len(group) * magnitude / denominator if denominator > 0 else math.inf
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
    """One token's reference: its loss `l_t` and `d l_t / d new_t` (before the aggregation's weight), and which side of
    the trust region its ratio is on."""

    value: float
    grad: float
    ratio: float
    side: str
    """"inside" the trust region, "capped" (beyond it on the side that would raise the objective: the gradient is 0),
    "pessimistic" (beyond it on the other side: the unclipped term is the minimum and keeps its gradient), or
    "dual_capped" (A < 0 and the ratio above the declared dual clip c: the objective is c A, flat)."""
    magnitude: float
    """The size of the terms that make up `value` and `grad`, each times its conditioning: what rounding scales with."""


def token_reference(
    spec: AlgorithmSpec, new: float, old: float, ref: float, advantage: float, clip_eps: float, kl_beta: float
) -> TokenReference:
    """One token's reference loss and gradient under the declared KL estimator (k3, k2, k3_ratio or none), KL clamp
    and dual clip, in float64."""
    ratio = math.exp(new - old)
    low, high = 1.0 - clip_eps, 1.0 + clip_eps
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
    delta = ref - new
    # A log-prob rounded to the dtype is off by eps times its own size, so `new - old` and `ref - new` are off by eps
    # times the inputs' sizes (not the difference's), which `exp` turns into a relative error of the ratio.
    if spec.kl_estimator in ("k3", "k3_ratio") and kl_beta:
        kl, kl_grad = math.expm1(delta) - delta, -math.expm1(delta)
        kl_size = (math.exp(delta) + 1.0) * (1.0 + abs(ref) + abs(new))
    elif spec.kl_estimator == "k2" and kl_beta:
        kl, kl_grad = delta * delta / 2, -delta
        kl_size = (abs(delta) + 1.0) * (1.0 + abs(ref) + abs(new))
    else:
        kl, kl_grad, kl_size = 0.0, 0.0, 0.0
    if spec.kl_clamp is not None and kl > spec.kl_clamp:
        kl, kl_grad = spec.kl_clamp, 0.0
    if spec.kl_estimator == "k3_ratio":  # d(r k)/d new = r k + r dk/d new: the ratio carries a gradient too
        kl, kl_grad, kl_size = ratio * kl, ratio * (kl + kl_grad), ratio * (kl_size + abs(kl))
    magnitude = abs(advantage) * ratio * (1.0 + abs(new) + abs(old)) + kl_beta * kl_size
    return TokenReference(
        value=-surrogate + kl_beta * kl,
        grad=-surrogate_grad + kl_beta * kl_grad,
        ratio=ratio,
        side=side,
        magnitude=magnitude,
    )


def token_tolerance(at: Precision, weight: float, token: TokenReference) -> float:
    """How far one token's weighted gradient (or weighted loss) computed at precision `at` may be from the
    reference: the rounding of `new - old` and `ref - new`, amplified by `exp`, plus one rounding of each product (and
    a result below the smallest normal number may flush to zero)."""
    return TOLERANCE_FACTOR * (at.eps * abs(weight) * (token.magnitude + abs(token.grad) + abs(token.value)) + at.tiny)
