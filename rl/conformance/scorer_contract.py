"""The laws of `rl.protocols.Scorer`: one finite reward per rollout, in the rollouts' order."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rl.conformance.support.contract_base import ContractBase, Run, law_settings, must_provide, tier
from rl.protocols import Scorer
from rl.types import Rollout

__all__ = ["ScorerContract", "default_scorer_group"]


_COMPLETIONS = ("####4", "4", "####5", "the answer is 7", "", "#### 4", "45", "####four")


def default_scorer_group() -> list[Rollout]:
    """Eight completions of the digit task's "3=" (answer "4") that the tutorial's reward scores differently."""
    return [
        Rollout(
            group_id=0,
            question="3=",
            answer="4",
            completion=c,
            prompt_token_ids=[2, 7, 10],
            token_ids=[ord(ch) % 50 for ch in c] or [1],
            logprobs=[-1.0] * max(len(c), 1),
            policy_version=0,
            seed=0,
        )
        for c in _COMPLETIONS
    ]


@tier("scorer")
class ScorerContract(ContractBase):
    """Laws of `rl.protocols.Scorer`: one finite reward per rollout, in the rollouts' order."""

    @pytest.fixture
    def scorer(self) -> Scorer:
        """Return the `rl.protocols.Scorer` under test."""
        raise must_provide("ScorerContract", "scorer", "the rl.protocols.Scorer under test")

    @pytest.fixture
    def scorer_group(self) -> list[Rollout]:
        """The group the laws score; defaults to `default_scorer_group()` (override for a scorer that needs others)."""
        return default_scorer_group()

    def test_scorer_returns_one_finite_reward_per_rollout(
        self, scorer: Scorer, scorer_group: list[Rollout], rl_run: Run[Any]
    ) -> None:
        """`score_group` returns as many rewards as rollouts, each a finite real number."""
        rewards = rl_run(scorer.score_group(scorer_group))
        assert len(rewards) == len(scorer_group), f"{len(rewards)} rewards for {len(scorer_group)} rollouts"
        for i, r in enumerate(rewards):
            assert isinstance(r, int | float) and not isinstance(r, bool), f"reward {i} is a {type(r).__name__}"
            assert math.isfinite(r), f"reward {i} ({scorer_group[i].completion!r}) is {r!r}, not finite"

    @law_settings(max_examples=10)
    @given(data=st.data())
    def test_scorer_permuting_a_group_permutes_its_rewards(
        self, scorer: Scorer, scorer_group: list[Rollout], rl_run: Run[Any], data: Any
    ) -> None:
        """Scoring a permuted group returns the same rewards permuted the same way (rewards follow their rollouts)."""
        order = data.draw(st.permutations(range(len(scorer_group))), label="order")
        base = rl_run(scorer.score_group(scorer_group))
        permuted = rl_run(scorer.score_group([scorer_group[i] for i in order]))
        expected = [base[i] for i in order]
        assert permuted == expected, f"scoring the group in order {order} gave {permuted}, expected {expected}"
