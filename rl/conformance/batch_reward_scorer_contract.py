"""The laws of a Scorer built over a user's batch reward function: one reward per completion, from that completion.

Libraries call a user's reward function once per group, with every completion (TRL's `reward_funcs`, verl's
`compute_score` batches), and store what it returns as the group's rewards. A reward function that returns one value
for the group, or one too few, is the user's bug; the scorer's law is that it never trains on it. TRL's GRPOTrainer
assigned the returned list into a `(completions,)` column, which torch broadcasts from a single value: every
completion got the first one's reward, and training ran on, silently (huggingface/trl#6533, fixed in trl 1.10.0).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest

from rl.conformance.scorer_contract import default_scorer_group
from rl.conformance.support.contract_base import ContractBase, Run, must_provide, tier
from rl.protocols import Scorer
from rl.types import Rollout

__all__ = ["BatchReward", "BatchRewardScorerContract"]

BatchReward = Callable[[list[str], list[str]], list[float]]
"""A user's batch reward function: `(completions, answers) -> rewards`, called once with a whole group."""


def _length_reward(completions: list[str], answers: list[str]) -> list[float]:
    """A correct batch reward: each completion's own length (the default group's are all different but two)."""
    return [float(len(c)) for c in completions]


@tier("batch_reward")
class BatchRewardScorerContract(ContractBase):
    """Laws of a Scorer over a batch reward function: one reward per completion, from that completion."""

    @pytest.fixture
    def batch_reward_scorer(self) -> Callable[[BatchReward], Scorer]:
        """Return a factory: given a `BatchReward`, the `rl.protocols.Scorer` that calls it once per group and
        returns its rewards (yours: the code that turns a user's reward function into a group's rewards)."""
        raise must_provide(
            "BatchRewardScorerContract", "batch_reward_scorer", "a factory of Scorers over a batch reward function"
        )

    def test_batch_reward_scorer_gives_each_completion_its_own_reward(
        self, batch_reward_scorer: Callable[[BatchReward], Scorer], rl_run: Run[Any]
    ) -> None:
        """Over a correct reward function, each completion gets the reward computed from it, in the group's order."""
        group = default_scorer_group()
        rewards = rl_run(batch_reward_scorer(_length_reward).score_group(group))
        expected = [float(len(r.completion)) for r in group]
        assert list(rewards) == expected, f"scored {list(rewards)}, expected each completion's own {expected}"

    @pytest.mark.parametrize("returned", ["one", "one_too_few", "one_too_many"])
    def test_batch_reward_scorer_refuses_a_reward_count_other_than_one_per_completion(
        self, batch_reward_scorer: Callable[[BatchReward], Scorer], rl_run: Run[Any], returned: str
    ) -> None:
        """A reward function that returns one value for the group, or one too few or too many, is refused with a
        `ValueError` naming the count: a single value is never broadcast to every completion (huggingface/trl#6533),
        nor a short list padded or a long one cut."""
        group = default_scorer_group()
        count = {"one": 1, "one_too_few": len(group) - 1, "one_too_many": len(group) + 1}[returned]

        def wrong_count(completions: list[str], answers: list[str]) -> list[float]:
            return [float(len(c)) for c in completions][:count] + [0.0] * (count - len(completions))

        scorer = batch_reward_scorer(wrong_count)
        try:
            rewards: Sequence[float] | None = rl_run(scorer.score_group(group))
        except ValueError:
            return
        except Exception as exc:  # a shape error from deep inside, not a refusal saying what to fix
            raise AssertionError(
                f"a reward function returning {count} rewards for {len(group)} completions raised "
                f"{type(exc).__name__}: {exc}; refuse it with a ValueError naming both counts"
            ) from exc
        raise AssertionError(
            f"a reward function returning {count} rewards for {len(group)} completions was scored as {rewards}: "
            "one reward per completion, from that completion; refuse any other count with a ValueError"
        )


def rollout_texts(rollouts: Sequence[Rollout]) -> tuple[list[str], list[str]]:
    """The `(completions, answers)` a batch reward function is called with, in the group's order."""
    return [r.completion for r in rollouts], [r.answer for r in rollouts]
