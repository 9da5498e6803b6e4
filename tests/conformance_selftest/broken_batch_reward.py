"""Scorers over a batch reward function with the bugs real ones had, for the self-test
(tests/conformance_selftest/test_broken_batch_reward.py)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from rl.conformance import Implementation
from rl.types import Rollout

Reward = Callable[[list[str], list[str]], list[float]]


class BroadcastingScorer:
    """TRL before 1.10 (huggingface/trl#6533): the returned list assigned into a `(completions,)` column, which torch
    broadcasts from one value (and fails on any other wrong length with its own shape error)."""

    def __init__(self, reward: Reward) -> None:
        self.reward = reward

    async def score_group(self, rollouts: Sequence[Rollout]) -> list[float]:
        rewards = self.reward([r.completion for r in rollouts], [r.answer for r in rollouts])
        if len(rewards) == 1:  # `column[:] = torch.tensor(rewards)`, in plain Python (torch's broadcasting rule)
            return [float(rewards[0])] * len(rollouts)
        if len(rewards) != len(rollouts):
            raise RuntimeError(f"The expanded size of the tensor ({len(rollouts)}) must match ({len(rewards)})")
        return [float(x) for x in rewards]


class ZipScorer:
    """Pairs rewards with rollouts by `zip`: a short list drops the last rollouts' rewards, a long one is cut."""

    def __init__(self, reward: Reward) -> None:
        self.reward = reward

    async def score_group(self, rollouts: Sequence[Rollout]) -> list[float]:
        rewards = self.reward([r.completion for r in rollouts], [r.answer for r in rollouts])
        return [float(x) for _, x in zip(rollouts, rewards, strict=False)]


BROADCASTING = Implementation(name="broadcasting-reward", batch_reward_scorer=BroadcastingScorer)
ZIPPED = Implementation(name="zipped-reward", batch_reward_scorer=ZipScorer)
