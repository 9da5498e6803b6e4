"""Laws of group-relative advantages (GRPO, and Dr. GRPO's unscaled variant)."""

from __future__ import annotations

import math
import statistics

import pytest
from hypothesis import given
from hypothesis import strategies as st
from strategies import Groups, dyadic_rewards, finite_rewards, groups

from rl.advantages import group_normalized_advantages, no_signal_groups

SCALES = st.sampled_from(["group", "none"])
ULP = 2.0**-52


def _denominator(rewards: list[float], scale: str, eps: float) -> float:
    return statistics.pstdev(rewards) + eps if scale == "group" else 1.0


def _zero_sum_tolerance(rewards: list[float], advantages: list[float], denominator: float) -> float:
    # Mean and subtraction each round by about one ulp of the largest |r|, G times over, then divided by the
    # denominator; the final division adds one relative ulp per advantage. math.ulp, not |r| * ULP: a subnormal
    # reward's rounding step is 5e-324 however small the reward (fmean([0.0, 5e-324]) is 0.0).
    magnitude = max(abs(r) for r in rewards)
    return 4 * len(rewards) * math.ulp(magnitude) / denominator + 4 * ULP * sum(abs(a) for a in advantages)


@given(data=st.data())
def test_advantages_sum_to_zero_within_each_group_of_two_or_more(data):
    """Within every group of size >= 2 the advantages sum to zero, up to rounding scaled to the rewards' magnitude."""
    g: Groups = data.draw(groups(min_size=2))
    scale = data.draw(SCALES)
    adv = group_normalized_advantages(g.group_ids, g.rewards, scale=scale)
    for members in g.members().values():
        rs = [g.rewards[i] for i in members]
        advs = [adv[i] for i in members]
        assert abs(math.fsum(advs)) <= _zero_sum_tolerance(rs, advs, _denominator(rs, scale, 1e-4))


@given(data=st.data())
def test_all_equal_group_gets_exact_zeros_never_nan(data):
    """A group whose rewards are all equal gets exactly 0.0 for each member, under both scales and even with eps=0."""
    value = data.draw(finite_rewards())
    size = data.draw(st.integers(min_value=1, max_value=10))
    others: Groups = data.draw(groups(min_groups=0, max_groups=3))
    silent_id = max(others.group_ids, default=0) + 1
    ids = [*others.group_ids, *[silent_id] * size]
    rewards = [*others.rewards, *[value] * size]
    scale = data.draw(SCALES)
    eps = data.draw(st.sampled_from([0.0, 1e-4]))
    adv = group_normalized_advantages(ids, rewards, scale=scale, eps=eps)
    assert adv[len(others.group_ids) :] == [0.0] * size
    assert not any(math.isnan(a) for a in adv)


def test_fmean_rounding_in_an_all_equal_group_does_not_leak_into_advantages():
    """The case that motivates the exact-zero rule: fmean([0.1] * 3) != 0.1, yet the advantages are exactly zero."""
    assert statistics.fmean([0.1] * 3) != 0.1  # if this ever holds, the case below no longer tests anything
    assert group_normalized_advantages([7, 7, 7], [0.1, 0.1, 0.1]) == [0.0, 0.0, 0.0]
    assert group_normalized_advantages([7, 7, 7], [0.1, 0.1, 0.1], scale="none") == [0.0, 0.0, 0.0]


@given(data=st.data())
def test_default_scale_is_the_seed_formula_exactly_on_groups_with_signal(data):
    """By default, every group with unequal rewards gets the seed's `(r - fmean) / (pstdev + 1e-4)` bit for bit."""
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
def test_permuting_samples_permutes_advantages(data):
    """Reordering the samples (ids and rewards together) reorders the advantages the same way, bit for bit."""
    g: Groups = data.draw(groups())
    scale = data.draw(SCALES)
    order = data.draw(st.permutations(range(len(g.rewards))))
    adv = group_normalized_advantages(g.group_ids, g.rewards, scale=scale)
    permuted = group_normalized_advantages([g.group_ids[i] for i in order], [g.rewards[i] for i in order], scale=scale)
    assert permuted == [adv[i] for i in order]


@given(data=st.data())
def test_relabelling_groups_leaves_advantages_unchanged(data):
    """Permuting the group ids among the groups (any bijection of labels) does not change any sample's advantage."""
    g: Groups = data.draw(groups())
    labels = sorted(set(g.group_ids))
    renamed = dict(zip(labels, data.draw(st.permutations(labels)), strict=True))
    scale = data.draw(SCALES)
    assert group_normalized_advantages([renamed[i] for i in g.group_ids], g.rewards, scale=scale) == (
        group_normalized_advantages(g.group_ids, g.rewards, scale=scale)
    )


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
