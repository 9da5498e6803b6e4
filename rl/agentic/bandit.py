"""The tutorial's bandit policy and an exactly-once trainer around it.

`bandit_update` is the update rule: for every reward with a found document and a positive reward, move that world's
prior toward the document by `lr · reward`. Floating-point addition is not associative, so the order of `rewards`
reaches the bits of the result: one more reason the driver hands the trainer a canonical (trial-id sorted) batch.

`BanditTrainer` holds the weights across steps (the stand-in for GPU-resident shards and optimizer state) with an
applied-steps ledger: a step is applied once; re-sending it with the same payload returns the recorded weights (a
retried or replayed step task); re-sending it with a different payload — another reward order included — raises
`StepPayloadConflictError` instead of silently training twice.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from rl.agentic.world import N_DOCS
from rl.errors import StepOutOfOrderError, StepPayloadConflictError, TrainerMismatchError
from rl.identity import content_digest
from rl.types import Reward, StepResult, TrainerInfo, Weights


@runtime_checkable
class PolicyTrainer(Protocol):
    """What a training-step task calls; `BanditTrainer` in process, `rl.agentic.ray_trainer` as a detached Ray actor."""

    def update(self, step: int, rewards: Sequence[Reward], lr: float) -> Weights: ...

    def weights(self) -> Weights: ...

    def info(self) -> TrainerInfo: ...


def initial_weights(world_ids: Sequence[str], n_docs: int = N_DOCS) -> Weights:
    """Version 0: a uniform prior over every world's documents."""
    return Weights(version=0, doc_prior={w: [1.0] * n_docs for w in world_ids})


def bandit_update(weights: Weights, rewards: Sequence[Reward], lr: float) -> Weights:
    """prior[world][found_doc] += lr · reward for each positively rewarded find, in the given order; version + 1."""
    prior = {w: list(p) for w, p in weights.doc_prior.items()}
    for r in rewards:
        if r.found_doc is None or r.reward <= 0:
            continue
        if r.world_id not in prior:
            raise ValueError(
                f"reward for trial {r.trial_id} names world {r.world_id!r}, which the policy does not have"
            )
        prior[r.world_id][r.found_doc] += lr * r.reward
    return Weights(version=weights.version + 1, doc_prior=prior)


def payload_digest(step: int, rewards: Sequence[Reward], lr: float) -> str:
    """The identity of one step's payload (list order included, as an action's identity includes it)."""
    return content_digest("train_step", step, list(rewards), lr)


def step_result(step: int, rewards: Sequence[Reward], weights: Weights, identity: int) -> StepResult:
    """The step's summary as the tutorial reports it: mean reward (3 dp) and mean turns (2 dp) over the judged
    trials."""
    n = max(1, len(rewards))
    return StepResult(
        step=step,
        weights=weights,
        mean_reward=round(sum(r.reward for r in rewards) / n, 3),
        mean_turns=round(sum(r.n_turns for r in rewards) / n, 2),
        n_trials=len(rewards),
        actor_pid=identity,
    )


@dataclass(frozen=True)
class _Applied:
    digest: str
    weights: Weights


class BanditTrainer:
    """The bandit's trainable state with an applied-steps ledger (exactly-once updates). Not thread-safe."""

    def __init__(self, world_ids: Sequence[str], *, identity: int | None = None, n_docs: int = N_DOCS) -> None:
        self.world_ids = list(world_ids)
        self.identity = os.getpid() if identity is None else identity
        self._weights = initial_weights(self.world_ids, n_docs)
        self._applied: dict[int, _Applied] = {}
        self.applications: Counter[int] = Counter()  # how often each step's update really ran: 1, always

    def update(self, step: int, rewards: Sequence[Reward], lr: float) -> Weights:
        """Apply step `step` once; a re-sent identical step returns its recorded weights."""
        digest = payload_digest(step, rewards, lr)
        done = self._applied.get(step)
        if done is not None:
            if done.digest != digest:
                raise StepPayloadConflictError(step, done.digest, digest)
            return done.weights
        expected = len(self._applied)
        if step != expected:
            raise StepOutOfOrderError(
                f"step {step} arrived but the next step to apply is {expected} (applied: {sorted(self._applied)}); "
                "steps apply in order — run the missing steps first"
            )
        self._weights = bandit_update(self._weights, rewards, lr)
        self._applied[step] = _Applied(digest, self._weights)
        self.applications[step] += 1
        return self._weights

    def weights(self) -> Weights:
        return self._weights

    def info(self) -> TrainerInfo:
        return TrainerInfo(identity=self.identity, version=self._weights.version, applied_steps=sorted(self._applied))

    def check_world_ids(self, world_ids: Sequence[str]) -> None:
        """Refuse to reuse this trainer for another set of worlds."""
        if list(world_ids) != self.world_ids:
            raise TrainerMismatchError(
                f"trainer {self.identity} was created for worlds {self.world_ids}, not {list(world_ids)}; "
                "use a new trainer name (or namespace) for a run over other worlds"
            )
