"""huggingface/trl#6533: TRL's own reward plumbing (`GRPOTrainer._calculate_rewards`) as a batch-reward Scorer.

Before trl 1.10.0 (fixed by huggingface/trl#6534) `_calculate_rewards` assigned a reward function's list straight into
the `(completions,)` column of its rewards tensor, so a function returning one value had it broadcast to every
completion. The same binding runs on both releases: the user's batch reward function is TRL's only reward function
(it gets the completions and the dataset column `answer`), and `score_group` returns `_calculate_rewards`' column.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import trl

from peers.trl_trainer import tiny_trainer
from rl.conformance import Implementation
from rl.types import Rollout

Reward = Callable[[list[str], list[str]], list[float]]


class TrlBatchRewardScorer:
    """`GRPOTrainer._calculate_rewards(inputs, prompts, completions, completion_ids)` over one reward function."""

    def __init__(self, reward: Reward) -> None:
        self.reward = reward

    async def score_group(self, rollouts: Sequence[Rollout]) -> list[float]:
        trainer = tiny_trainer()

        def user_reward(prompts: list[Any], completions: list[str], answer: list[str], **_: Any) -> list[float]:
            return self.reward(list(completions), list(answer))

        trainer.reward_funcs[0] = user_reward  # the one reward function, as `reward_funcs=[user_reward]` makes it
        inputs = [{"prompt": r.question, "answer": r.answer} for r in rollouts]
        prompts = [r.question for r in rollouts]
        completions = [r.completion for r in rollouts]
        ids = [list(r.token_ids) for r in rollouts]
        rewards = trainer._calculate_rewards(inputs, prompts, completions, ids)  # [completions, reward functions]
        return [float(x) for x in rewards[:, 0].tolist()]


IMPL = Implementation(name=f"trl-{trl.__version__}-rewards", batch_reward_scorer=TrlBatchRewardScorer)
