"""The reward and evaluation tiers on plain Python: a Scorer over a named reward, an Evaluator over any engine."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from rl.metrics import avg_at_k, pass_at_k
from rl.protocols import RolloutEngine, is_batched
from rl.rewards import get_reward, is_correct
from rl.seeding import eval_problem_seed
from rl.types import ArtifactRef, EvalResult, Prompt, Rollout, RolloutRequest


class RewardScorer:
    """Scorer: one named reward from `rl.rewards.REWARDS` applied to each completion of a group (one call per group)."""

    def __init__(self, reward: str = "default") -> None:
        self.reward_name = reward
        self.reward = get_reward(reward)

    async def score_group(self, rollouts: Sequence[Rollout]) -> list[float]:
        return [float(self.reward(r.completion, r.answer)) for r in rollouts]


class BatchRewardScorer:
    """Scorer: a user's batch reward function `(completions, answers) -> rewards`, called once per group; a return
    that is not one finite reward per completion is refused, never broadcast or padded."""

    def __init__(self, reward: Callable[[list[str], list[str]], Sequence[float]]) -> None:
        self.reward = reward

    async def score_group(self, rollouts: Sequence[Rollout]) -> list[float]:
        rewards = list(self.reward([r.completion for r in rollouts], [r.answer for r in rollouts]))
        if len(rewards) != len(rollouts):
            raise ValueError(
                f"the reward function {getattr(self.reward, '__name__', self.reward)!r} returned {len(rewards)} "
                f"rewards for {len(rollouts)} completions: return exactly one reward per completion, in their order"
            )
        return [float(r) for r in rewards]


class SamplingEvaluator:
    """Evaluator: k samples per held-out problem from `engine`; a sample is correct when its answer is exact.

    Evaluation seeds are derived from the caller's seed and the problem index under an "eval" label, so they never
    coincide with a training rollout's seed.
    """

    def __init__(self, engine: RolloutEngine, prompts: Sequence[Prompt], *, max_tokens: int = 4) -> None:
        if not prompts:
            raise ValueError("SamplingEvaluator needs at least one held-out prompt")
        self.engine, self.prompts, self.max_tokens = engine, list(prompts), max_tokens

    async def evaluate(self, adapter: ArtifactRef, policy_version: int, k: int, seed: int) -> EvalResult:
        requests = [
            RolloutRequest(
                group_id=i,
                prompt=prompt,
                n=k,
                adapter=adapter,
                policy_version=policy_version,
                seed=eval_problem_seed(seed, i),
                max_tokens=self.max_tokens,
            )
            for i, prompt in enumerate(self.prompts)
        ]
        if is_batched(self.engine):
            groups = await self.engine.generate_groups(requests)  # one batch for every held-out problem
        else:
            groups = [await self.engine.generate(request) for request in requests]
        correct = [
            sum(is_correct(r.completion, prompt.answer) for r in group)
            for prompt, group in zip(self.prompts, groups, strict=True)
        ]
        return EvalResult(
            policy_version=policy_version,
            k=k,
            avg_at_k=avg_at_k(correct, k),
            pass_at_k=sum(pass_at_k(k, c, k) for c in correct) / len(correct),
            problems=len(correct),
        )
