"""The laws of the scoring utilities a fork swaps: answer extraction and pass@k, against exact references.

A reward is only as right as the answer it extracts, and an evaluation only as right as its pass@k: a fork that rewrites
either (another regex, the biased `1 - (1 - c/n)^k`) trains on wrong rewards or reports wrong curves with no error.
Bind `extract_answer` (`(completion) -> str | None`, like `rl.rewards.extract_answer`) and `pass_at_k`
(`(n, c, k) -> float`, like `rl.metrics.pass_at_k`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from decimal import Decimal, InvalidOperation
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rl.conformance.support.contract_base import ContractBase, explicit_examples, law_settings, must_provide, tier

__all__ = ["ScoringUtilitiesContract", "exact_pass_at_k"]

PASS_AT_K_TOLERANCE = 1e-12
"""Absolute: a float product of at most a few hundred factors each rounded once stays far below it."""

PROSE = ("Step 1: 3 + 5 = 8, then 8 * 12 = 96.", "She had 1,024 apples and sold 17.", "No numbers here.", "")
"""What comes before the marker: numbers in the reasoning must never be taken for the answer."""
TRAILING = ("", " dollars.", "\n")

Completion = tuple[str, Decimal, str, str]
"""(prose, the answer, how it is written, what follows it)."""


def exact_pass_at_k(n: int, c: int, k: int) -> float:
    """`1 - C(n - c, k) / C(n, k)` in exact rational arithmetic, rounded once to a float."""
    return float(1 - Fraction(math.comb(n - c, k), math.comb(n, k)))


def _written(value: Decimal, style: str) -> str:
    if style == "thousands":
        return f"{value:,}"
    if style == "trailing-zeros" and value == value.to_integral_value():
        return f"{value:.2f}"
    return str(value)


ANSWERS = st.one_of(
    st.integers(-(10**9), 10**9).map(Decimal),
    st.decimals(min_value=-1000, max_value=1000, places=2, allow_nan=False, allow_infinity=False),
)
COMPLETIONS = st.tuples(
    st.sampled_from(PROSE),
    ANSWERS,
    st.sampled_from(["plain", "thousands", "trailing-zeros"]),
    st.sampled_from(TRAILING),
)
EXTRACTION_HAZARDS: tuple[Completion, ...] = (
    (PROSE[0], Decimal(1200), "thousands", ""),  # "1,200": the separator must not end the number
    (PROSE[1], Decimal(42), "trailing-zeros", " dollars."),  # "42.00" is 42; the prose's 1,024 and 17 are not it
    (PROSE[2], Decimal(-7), "plain", "\n"),
    (PROSE[0], Decimal(1234567), "thousands", ""),
)
PASS_AT_K_HAZARDS = ((100, 1, 100), (200, 199, 1), (10, 0, 5), (1, 1, 1), (200, 3, 50), (7, 6, 2))


@tier("scorer")
class ScoringUtilitiesContract(ContractBase):
    """Answer extraction and pass@k, each against an exact reference. Provide `extract_answer` and `pass_at_k`."""

    @pytest.fixture
    def extract_answer(self) -> Callable[[str], str | None]:
        """Return `(completion) -> str | None`: the answer a GSM8K-style completion commits to (after `####`)."""
        raise must_provide("ScoringUtilitiesContract", "extract_answer", "your answer extraction function")

    @pytest.fixture
    def pass_at_k(self) -> Callable[[int, int, int], float]:
        """Return `(n, c, k) -> float`: pass@k from `n` samples of which `c` are correct."""
        raise must_provide("ScoringUtilitiesContract", "pass_at_k", "your pass@k function")

    @law_settings(max_examples=50)
    @given(case=COMPLETIONS)
    @explicit_examples(*EXTRACTION_HAZARDS)
    def test_scoring_extracts_the_number_after_the_answer_marker(
        self, extract_answer: Callable[[str], str | None], case: Completion
    ) -> None:
        """A completion of reasoning (with numbers of its own), `#### ` and a number (thousands separators, trailing
        zeros, a sign, decimals), then text without digits, extracts that number, equal as a decimal."""
        prose, value, style, trailing = case
        completion = f"{prose}\n#### {_written(value, style)}{trailing}"
        got = extract_answer(completion)
        try:
            equal = got is not None and Decimal(str(got).replace(",", "")) == value
        except InvalidOperation:
            equal = False
        assert equal, (
            f"extract_answer({completion!r}) gave {got!r}; the answer after '####' is {value}. Take the number after "
            "the last marker, whole (thousands separators and decimals included), never one from the reasoning"
        )

    def test_scoring_a_completion_without_a_number_extracts_nothing(
        self, extract_answer: Callable[[str], str | None]
    ) -> None:
        """A completion holding no number, with or without the marker, extracts None (it can never be correct)."""
        for completion in ("I do not know.", "#### ", "", "#### none"):
            got = extract_answer(completion)
            assert got is None, f"extract_answer({completion!r}) gave {got!r}, expected None"

    @law_settings(max_examples=50)
    @given(case=st.integers(1, 200).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n), st.integers(1, n))))
    @explicit_examples(*PASS_AT_K_HAZARDS)
    def test_scoring_pass_at_k_is_the_unbiased_estimator(
        self, pass_at_k: Callable[[int, int, int], float], case: tuple[int, int, int]
    ) -> None:
        """pass@k equals `1 - C(n-c, k) / C(n, k)` computed exactly (Chen et al. 2021), within 1e-12, for n up to
        200: not the biased `1 - (1 - c/n)^k`, not a float binomial that overflows."""
        n, c, k = case
        got, exact = pass_at_k(n, c, k), exact_pass_at_k(n, c, k)
        assert abs(got - exact) <= PASS_AT_K_TOLERANCE, (
            f"pass_at_k(n={n}, c={c}, k={k}) = {got!r}; the unbiased estimator 1 - C(n-c,k)/C(n,k) is {exact!r} "
            f"(the biased 1 - (1 - c/n)^k is {1 - (1 - c / n) ** k!r}). Use 1 - prod_(i=n-c+1..n) (1 - k/i)"
        )

    @pytest.mark.parametrize("bad", [(5, 6, 1), (5, 2, 0), (5, 2, 6), (5, -1, 1)], ids=["c>n", "k=0", "k>n", "c<0"])
    def test_scoring_pass_at_k_refuses_impossible_counts(
        self, pass_at_k: Callable[[int, int, int], float], bad: tuple[int, int, int]
    ) -> None:
        """Counts no evaluation can produce (more correct than samples, k outside 1..n) raise `ValueError`."""
        try:
            got = pass_at_k(*bad)
        except ValueError:
            return
        pytest.fail(f"pass_at_k{bad} returned {got!r}; raise ValueError for counts outside 0 <= c <= n, 1 <= k <= n")
