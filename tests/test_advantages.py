"""Our group-relative advantages (GRPO, and Dr. GRPO's unscaled variant): the packaged `AdvantageContract` under each
declaration we support, then what only ours promises."""

from __future__ import annotations

import functools
import math
import statistics

import pytest
from hypothesis import given
from hypothesis import strategies as st
from strategies import Groups, dyadic_rewards, groups

from rl.algorithm.advantages import group_normalized_advantages, no_signal_groups
from rl.conformance import AdvantageContract, AlgorithmSpec

SCALES = st.sampled_from(["population_std", "none"])


class TestOurAdvantagesWithoutEps(AdvantageContract):
    """Our advantages with `eps=0.0` under that declaration: exact zeros for all-equal groups even where the std is 0,
    and every other law. The default (`eps=1e-4`, population std) is checked by `TestInMemory` and Dr. GRPO's
    `scale="none"` by `TestTrainerConfigAlgorithms` (both in test_conformance_ours.py); the tests below check what the
    contract does not: the tutorial's formula bit for bit, affine invariance, the bound, and the errors."""

    @pytest.fixture
    def advantages(self):
        return functools.partial(group_normalized_advantages, eps=0.0)

    @pytest.fixture
    def algorithm(self):
        return AlgorithmSpec(std_eps=0.0)


@given(data=st.data())
def test_default_scale_is_the_seed_formula_exactly_on_groups_with_signal(data):
    """By default, every group with unequal rewards gets the tutorial's `(r - fmean) / (pstdev + 1e-4)` bit for bit."""
    g: Groups = data.draw(groups())
    adv = group_normalized_advantages(g.group_ids, g.rewards)
    for members in g.members().values():
        rs = [g.rewards[i] for i in members]
        if len(set(rs)) == 1:
            continue
        mean, std = statistics.fmean(rs), statistics.pstdev(rs)
        assert [adv[i] for i in members] == [(r - mean) / (std + 1e-4) for r in rs]


@given(data=st.data())
def test_group_scaling_is_invariant_under_positive_affine_rewards(data):
    """With std scaling (eps=0, where the law is exact), r -> a*r + b with a > 0 leaves every advantage unchanged."""
    g: Groups = data.draw(groups(dyadic_rewards()))
    a = data.draw(st.integers(min_value=1, max_value=32)) / 8  # dyadic, so a*r + b is exact
    b = data.draw(dyadic_rewards())
    before = group_normalized_advantages(g.group_ids, g.rewards, eps=0.0)
    after = group_normalized_advantages(g.group_ids, [a * r + b for r in g.rewards], eps=0.0)
    for x, y in zip(before, after, strict=True):
        assert math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-9)


@given(data=st.data())
def test_advantages_are_invariant_under_reward_shift_at_default_eps(data):
    """Adding one constant to every reward changes no advantage, for both scales and the default eps."""
    g: Groups = data.draw(groups(dyadic_rewards()))
    b = data.draw(dyadic_rewards())
    scale = data.draw(SCALES)
    before = group_normalized_advantages(g.group_ids, g.rewards, scale=scale)
    after = group_normalized_advantages(g.group_ids, [r + b for r in g.rewards], scale=scale)
    for x, y in zip(before, after, strict=True):
        assert math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-8)


@given(data=st.data())
def test_unscaled_advantages_are_linear_in_the_reward_scale(data):
    """With scale="none" (Dr. GRPO), r -> a*r + b multiplies every advantage by a."""
    g: Groups = data.draw(groups(dyadic_rewards()))
    a = data.draw(st.integers(min_value=1, max_value=32)) / 8
    b = data.draw(dyadic_rewards())
    before = group_normalized_advantages(g.group_ids, g.rewards, scale="none")
    after = group_normalized_advantages(g.group_ids, [a * r + b for r in g.rewards], scale="none")
    for x, y in zip(before, after, strict=True):
        assert math.isclose(y, a * x, rel_tol=1e-9, abs_tol=1e-9)


@given(data=st.data())
def test_group_advantages_are_bounded_by_sqrt_group_size_minus_one(data):
    """With std scaling, |A| <= sqrt(G - 1) in a group of size G (attained by one outlier among equals, as eps -> 0)."""
    g: Groups = data.draw(groups(max_size=12))
    eps = data.draw(st.sampled_from([1e-4, 0.0]))
    adv = group_normalized_advantages(g.group_ids, g.rewards, eps=eps)
    for members in g.members().values():
        bound = math.sqrt(len(members) - 1)
        assert all(abs(adv[i]) <= bound * (1 + 1e-12) for i in members)


def test_a_spread_whose_std_underflows_gives_zeros_not_a_division_error():
    """With eps=0, a group whose std rounds to 0 (a subnormal spread) gets zeros, not a ZeroDivisionError."""
    assert group_normalized_advantages([0, 0], [0.0, 5e-324], eps=0.0) == [0.0, 0.0]


def test_one_outlier_among_equals_reaches_the_bound():
    """The bound is tight: G-1 equal rewards and one outlier give the outlier sqrt(G-1) when eps=0."""
    adv = group_normalized_advantages([0] * 5, [0.0, 0.0, 0.0, 0.0, 1.0], eps=0.0)
    assert math.isclose(adv[-1], 2.0, rel_tol=1e-15)  # mean 0.2, pstdev 0.4: (1 - 0.2) / 0.4


@given(data=st.data())
def test_no_signal_groups_are_exactly_the_all_equal_groups_sorted(data):
    """`no_signal_groups` returns exactly the ids of the groups whose rewards are all equal, sorted; each gets zeros."""
    g: Groups = data.draw(groups())
    silent = no_signal_groups(g.group_ids, g.rewards)
    members = g.members()
    expected = sorted(gid for gid, idx in members.items() if len({g.rewards[i] for i in idx}) == 1)
    assert silent == expected
    adv = group_normalized_advantages(g.group_ids, g.rewards)
    assert all(adv[i] == 0.0 for gid in silent for i in members[gid])


def test_empty_batch_gives_no_advantages_and_no_silent_groups():
    """No samples: no advantages, no silent groups, no error."""
    assert group_normalized_advantages([], []) == []
    assert no_signal_groups([], []) == []


@given(data=st.data())
def test_nan_or_infinite_reward_raises_naming_its_index(data):
    """A NaN or infinite reward anywhere raises ValueError whose message names that index."""
    g: Groups = data.draw(groups())
    index = data.draw(st.integers(min_value=0, max_value=len(g.rewards) - 1))
    bad = data.draw(st.sampled_from([math.nan, math.inf, -math.inf]))
    rewards = list(g.rewards)
    rewards[index] = bad
    for fn in (group_normalized_advantages, no_signal_groups):
        with pytest.raises(ValueError, match=rf"rewards\[{index}\]"):
            fn(g.group_ids, rewards)


@given(data=st.data())
def test_length_mismatch_raises_naming_the_first_unpaired_index(data):
    """`len(group_ids) != len(rewards)` raises ValueError naming the first index that has no partner."""
    g: Groups = data.draw(groups())
    extra = data.draw(st.integers(min_value=1, max_value=3))
    n = len(g.rewards)
    with pytest.raises(ValueError, match=rf"rewards\[{n}\]"):
        group_normalized_advantages(g.group_ids, [*g.rewards, *[0.0] * extra])
    with pytest.raises(ValueError, match=rf"group_ids\[{n}\]"):
        no_signal_groups([*g.group_ids, *[0] * extra], g.rewards)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"scale": "std"}, "scale must be one of"),
        ({"eps": -1e-4}, "eps must be finite and >= 0"),
        ({"eps": math.nan}, "eps must be finite and >= 0"),
    ],
)
def test_bad_options_raise_value_error(kwargs, message):
    """An unknown scale or a negative or NaN eps raises ValueError saying which option was wrong."""
    with pytest.raises(ValueError, match=message):
        group_normalized_advantages([0, 0], [0.0, 1.0], **kwargs)
