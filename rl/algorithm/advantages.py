"""Group-relative advantages (GRPO) and the groups that carry no learning signal.

GRPO (Shao et al., "DeepSeekMath", 2024, §4.1.2) replaces a learned value baseline with the other completions of the
same prompt: each completion's advantage is its reward standardised within its group,

    A_i = (r_i - mean(r_g)) / (std(r_g) + eps)        std: population standard deviation

and Dr. GRPO (Liu et al., "Understanding R1-Zero-Like Training", 2025) drops the division, `A_i = r_i - mean(r_g)`,
because dividing by the group's std up-weights prompts that are nearly always right or nearly always wrong.

Pure Python on purpose: the driver and the reward tier compute and log these without torch.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Sequence
from typing import Literal, get_args

from rl.algorithm.checks import finite_rewards

__all__ = ["Scale", "group_normalized_advantages", "no_signal_groups"]

Scale = Literal["population_std", "none"]
"""`"population_std"`: divide by the group's population std plus eps (GRPO); `"none"`: subtract the mean only (Dr.
GRPO). The names `rl.conformance.AlgorithmSpec.advantage_scale` declares them by."""

_SCALES: tuple[str, ...] = get_args(Scale)


def group_normalized_advantages(
    group_ids: Sequence[int],
    rewards: Sequence[float],
    *,
    scale: Scale = "population_std",
    eps: float = 1e-4,
) -> list[float]:
    """Each sample's reward relative to the other samples of its group, in input order.

    `scale="population_std"` (the default) is the tutorial's formula exactly:
    `(r - fmean(group)) / (pstdev(group) + eps)`. `scale="none"` is Dr. GRPO's `r - fmean(group)`.
    A group whose rewards are all equal (a single-sample group included) gives exactly 0.0 for each member under either
    scale: its mean can differ from its members by rounding (`fmean([0.1] * 3) != 0.1`), and a stray 1e-17 would
    otherwise become a gradient for a prompt that taught nothing. Samples of one group need not be contiguous;
    only which samples share a group id matters, not their order or the ids' values.

    Raises:
        ValueError: `len(group_ids) != len(rewards)`, an unknown `scale`, or a negative or non-finite `eps`.
        NonFiniteRewardError: a NaN or infinite reward (the message names its index); a `ValueError` too.
    """
    rewards_f = _checked_rewards(group_ids, rewards)
    if scale not in _SCALES:
        raise ValueError(f"scale must be one of {_SCALES}, got {scale!r}")
    if not (math.isfinite(eps) and eps >= 0.0):
        raise ValueError(f"eps must be finite and >= 0, got {eps!r}")

    advantages = [0.0] * len(rewards_f)
    for members in _members_by_group(group_ids).values():
        group_rewards = [rewards_f[i] for i in members]
        if _all_equal(group_rewards):
            continue
        # Rewards so large their sum could overflow (fsum raises on 2 x 1e308) are scaled down by a power of two,
        # which is exact: the advantages are the same numbers, computed where the sums fit.
        shift = max(0, math.frexp(max(abs(r) for r in group_rewards))[1] - _SAFE_EXPONENT)
        group_rewards = [math.ldexp(r, -shift) for r in group_rewards]
        # fmean (via fsum) and pstdev (via exact fractions) are correctly rounded from exact sums, so the advantages do
        # not depend on the order of the samples.
        mean = statistics.fmean(group_rewards)
        if scale == "population_std":
            denominator, unscale = statistics.pstdev(group_rewards) + math.ldexp(eps, -shift), 0
        else:
            denominator, unscale = 1.0, shift
        if denominator == 0.0:
            continue  # eps=0 and a spread so small its std underflows (e.g. [0.0, 5e-324]): nothing to scale by
        for i, r in zip(members, group_rewards, strict=True):
            advantages[i] = _unscaled((r - mean) / denominator, unscale)
            if not math.isfinite(advantages[i]):
                raise ValueError(
                    f"reward {rewards_f[i]!r} (index {i}) is {rewards_f[i] - _unscaled(mean, shift)!r} from its "
                    "group's mean, beyond the float range: with scale='none' the advantage is that difference; "
                    "rescale the rewards or use scale='population_std'"
                )
    return advantages


_SAFE_EXPONENT = 960
"""Rewards below 2**960 in magnitude are used as they are: a group of up to 2**60 of them sums without overflow."""


def _unscaled(value: float, shift: int) -> float:
    try:
        return math.ldexp(value, shift)
    except OverflowError:
        return math.copysign(math.inf, value)


def no_signal_groups(group_ids: Sequence[int], rewards: Sequence[float]) -> list[int]:
    """The ids of the groups whose rewards are all equal, sorted: every member's advantage is exactly 0, so the trainer
    skips them and the report counts them.

    A single-sample group is counted: with nothing to compare against it carries no signal either.

    Raises:
        ValueError: as `group_normalized_advantages`.
    """
    rewards_f = _checked_rewards(group_ids, rewards)
    silent = [
        gid for gid, members in _members_by_group(group_ids).items() if _all_equal([rewards_f[i] for i in members])
    ]
    return sorted(silent)


def _checked_rewards(group_ids: Sequence[int], rewards: Sequence[float]) -> list[float]:
    if len(group_ids) != len(rewards):
        first_unpaired = min(len(group_ids), len(rewards))
        longer = "rewards" if len(rewards) > len(group_ids) else "group_ids"
        raise ValueError(
            f"len(group_ids)={len(group_ids)} != len(rewards)={len(rewards)}: "
            f"{longer}[{first_unpaired}] has no partner in the other sequence"
        )
    return finite_rewards(
        rewards, lambda i, value: f"rewards[{i}] is {value!r} (group {group_ids[i]!r}); rewards must be finite"
    )


def _members_by_group(group_ids: Sequence[int]) -> dict[int, list[int]]:
    members: dict[int, list[int]] = defaultdict(list)
    for i, gid in enumerate(group_ids):
        members[gid].append(i)
    return members


def _all_equal(values: list[float]) -> bool:
    return all(v == values[0] for v in values)
