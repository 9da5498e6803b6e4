"""Rewards at the edge of the float range: the advantages are still the formula's numbers, never an overflow."""

from __future__ import annotations

import math
import statistics

import pytest

from rl.algorithm.advantages import group_normalized_advantages


def test_rewards_whose_sum_overflows_give_the_advantages_of_the_same_rewards_halved():
    """Scaling every reward by a power of two changes no group-scaled advantage (but eps's share): so 1e308s, whose
    sum overflows, get the advantages of their halves."""
    huge = [1e308, 1e308, 0.0, 0.0]
    assert group_normalized_advantages([0] * 4, huge, eps=0.0) == group_normalized_advantages(
        [0] * 4, [r / 2 for r in huge], eps=0.0
    )
    assert group_normalized_advantages([0] * 4, huge) == [1.0, 1.0, -1.0, -1.0]


def test_unscaled_advantages_of_huge_rewards_are_their_exact_differences_from_the_mean():
    got = group_normalized_advantages([0] * 4, [1e308, 1e308, 0.0, 0.0], scale="none")
    assert got == [5e307, 5e307, -5e307, -5e307]


def test_a_difference_beyond_the_float_range_is_refused_naming_the_reward():
    with pytest.raises(ValueError, match=r"index 2\).*beyond the float range.*scale='population_std'"):
        group_normalized_advantages([0, 0, 0], [1.7e308, 1.7e308, -1.7e308], scale="none")


def test_a_huge_group_beside_a_small_one_leaves_the_small_one_exact():
    got = group_normalized_advantages([0, 0, 1, 1], [1e308, -1e308, 0.1, 0.3])
    small = [0.1, 0.3]
    mean, std = statistics.fmean(small), statistics.pstdev(small)
    assert got[2:] == [(r - mean) / (std + 1e-4) for r in small]
    assert all(math.isfinite(a) for a in got)
