"""Laws of the pass@k estimator and avg@k."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rl.metrics import avg_at_k, pass_at_k, two_proportion_p


@st.composite
def n_c_k(draw: st.DrawFn, max_n: int = 200) -> tuple[int, int, int]:
    """A valid (n, c, k): n samples, c of them correct, k drawn."""
    n = draw(st.integers(min_value=1, max_value=max_n))
    return n, draw(st.integers(min_value=0, max_value=n)), draw(st.integers(min_value=1, max_value=n))


def _exact_pass_at_k(n: int, c: int, k: int) -> Fraction:
    # The definition itself: one minus the share of k-subsets of the n samples that miss every correct one.
    return 1 - Fraction(math.comb(n - c, k), math.comb(n, k))


@given(data=st.data())
def test_pass_at_k_equals_the_exact_combinatorial_value(data):
    """pass@k equals 1 - C(n-c, k)/C(n, k) computed in exact rational arithmetic, to within 1e-12."""
    n, c, k = data.draw(n_c_k())
    assert math.isclose(pass_at_k(n, c, k), float(_exact_pass_at_k(n, c, k)), rel_tol=1e-12, abs_tol=1e-12)


@given(data=st.data())
def test_pass_at_1_is_the_fraction_of_correct_samples(data):
    """pass@1 = c/n."""
    n, c, _ = data.draw(n_c_k())
    assert math.isclose(pass_at_k(n, c, 1), c / n, rel_tol=1e-12, abs_tol=1e-15)


@given(data=st.data())
def test_pass_at_k_is_monotone_in_k(data):
    """Drawing one more sample never lowers pass@k, exactly (no rounding reversal)."""
    n, c, k = data.draw(n_c_k())
    if k < n:
        assert pass_at_k(n, c, k) <= pass_at_k(n, c, k + 1)


@given(data=st.data())
def test_pass_at_k_is_monotone_in_c(data):
    """One more correct sample never lowers pass@k, exactly (no rounding reversal)."""
    n, c, k = data.draw(n_c_k())
    if c < n:
        assert pass_at_k(n, c, k) <= pass_at_k(n, c + 1, k)


@given(data=st.data())
def test_pass_at_k_is_a_probability_with_exact_endpoints(data):
    """pass@k lies in [0, 1]; it is exactly 0 with no correct sample and exactly 1 when every k-subset holds one."""
    n, c, k = data.draw(n_c_k())
    value = pass_at_k(n, c, k)
    assert 0.0 <= value <= 1.0
    assert pass_at_k(n, 0, k) == 0.0
    assert pass_at_k(n, n, k) == 1.0
    if n - c < k:
        assert value == 1.0


def test_pass_at_k_is_stable_where_the_binomials_overflow_a_float():
    """With n = 10**6 the binomials overflow a float, yet the product form matches the exact value."""
    n, c, k = 10**6, 10, 100
    with pytest.raises(OverflowError):
        float(math.comb(n, k))  # why a naive float ratio of binomials cannot be used
    assert math.isclose(pass_at_k(n, c, k), float(_exact_pass_at_k(n, c, k)), rel_tol=1e-12)


def test_pass_at_k_hand_worked_case():
    """n=4, c=1, k=2: of the C(4,2)=6 pairs, C(3,2)=3 miss the correct sample, so pass@2 = 1 - 3/6 = 0.5."""
    assert math.isclose(pass_at_k(4, 1, 2), 0.5, rel_tol=1e-15)


@pytest.mark.parametrize(
    ("n", "c", "k", "message"),
    [
        (5, 6, 1, "0 <= c <= n"),
        (5, -1, 1, "0 <= c <= n"),
        (5, 2, 0, "1 <= k <= n"),
        (5, 2, 6, "1 <= k <= n"),
        (0, 0, 1, "1 <= k <= n"),
        (5.0, 2, 1, "n must be an integer"),
        (5, True, 1, "c must be an integer"),
    ],
)
def test_pass_at_k_rejects_impossible_counts(n, c, k, message):
    """Counts outside 0 <= c <= n or 1 <= k <= n, or non-integers, raise ValueError saying which."""
    with pytest.raises(ValueError, match=message):
        pass_at_k(n, c, k)


@given(data=st.data())
def test_avg_at_k_is_the_mean_over_problems_of_pass_at_1(data):
    """avg@k equals the mean over problems of pass@1 from the same k samples, and lies in [0, 1]."""
    k = data.draw(st.integers(min_value=1, max_value=16))
    counts = data.draw(st.lists(st.integers(min_value=0, max_value=k), min_size=1, max_size=20))
    value = avg_at_k(counts, k)
    assert math.isclose(value, math.fsum(pass_at_k(k, c, 1) for c in counts) / len(counts), rel_tol=1e-12)
    assert 0.0 <= value <= 1.0


def test_avg_at_k_hand_worked_case():
    """Three problems with 4 samples each, 4, 1 and 0 correct: (4/4 + 1/4 + 0/4) / 3 = 1.25 / 3."""
    assert math.isclose(avg_at_k([4, 1, 0], 4), 1.25 / 3, rel_tol=1e-15)


@pytest.mark.parametrize(
    ("counts", "k", "message"),
    [
        ([1, 5], 4, r"correct_counts\[1\] must be in 0..4"),
        ([-1], 4, r"correct_counts\[0\] must be in 0..4"),
        ([True], 4, r"correct_counts\[0\] must be an integer"),
        ([1.0], 4, r"correct_counts\[0\] must be an integer"),
        ([], 4, "no problems"),
        ([0], 0, "k must be >= 1"),
    ],
)
def test_avg_at_k_rejects_bad_counts(counts, k, message):
    """A count outside 0..k, a non-integer count, no problems, or k < 1 raises ValueError saying which."""
    with pytest.raises(ValueError, match=message):
        avg_at_k(counts, k)


def test_two_proportion_p_hand_worked_case():
    """59/288 against 89/288: pooled 148/576, se = sqrt(p(1-p) * 2/288) = 0.03641, z = (30/288) / se = 2.861,
    two-sided p = erfc(z / sqrt(2)) = 0.00422; the same either way round."""
    assert math.isclose(two_proportion_p(59, 288, 89, 288), 0.00422, rel_tol=2e-3)
    assert two_proportion_p(89, 288, 59, 288) == two_proportion_p(59, 288, 89, 288)


def test_two_proportion_p_is_one_without_a_difference_and_falls_as_it_grows():
    assert two_proportion_p(10, 100, 10, 100) == 1.0 and two_proportion_p(0, 50, 0, 60) == 1.0
    ps = [two_proportion_p(20, 100, 20 + d, 100) for d in range(0, 30, 5)]
    assert ps == sorted(ps, reverse=True) and ps[-1] < 1e-3


@pytest.mark.parametrize(("a", "n", "b", "m"), [(5, 4, 1, 4), (-1, 4, 1, 4), (1, 0, 1, 4), (1, 4, 1.5, 4)])
def test_two_proportion_p_rejects_impossible_counts(a, n, b, m):
    with pytest.raises(ValueError, match="must be"):
        two_proportion_p(a, n, b, m)
