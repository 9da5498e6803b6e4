"""What the trainer laws of `trainer_padding_laws`, `truncation_laws` and `kl_reference_laws` share: a batch sampled by
the engine for given prompts, and the loss the declared `AlgorithmSpec` gives a step on it, computed the way
`trainer_restore_laws`' law computes it (the engine's log-probs as the trainer's, the recorded ones moved to the trust
region's pessimistic side, float64)."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import replace
from typing import Any, NamedTuple

import pytest

from rl.conformance.algorithm_spec import AlgorithmSpec
from rl.conformance.support.contract_base import Run
from rl.conformance.support.reference import reference_advantages, token_reference, token_weights
from rl.conformance.trainer_restore_laws import _shifted
from rl.protocols import RolloutEngine, Trainer
from rl.seeding import derive_seed
from rl.types import (
    DEFAULT_SAMPLING,
    ArtifactRef,
    Prompt,
    Rollout,
    RolloutRequest,
    SamplingSettings,
    TrainBatch,
    TrainResult,
)

__all__ = [
    "DIGIT_PROMPTS",
    "ENDING_DRAWS",
    "StepLawInputs",
    "batch_with_endings",
    "declared_step_loss",
    "ended",
    "law_batch",
    "sample_groups",
    "sampled_batch",
    "shifted_batch",
]

DIGIT_PROMPTS = (Prompt("3=", "4"), Prompt("7=", "8"))
"""The trainer laws' usual prompts, of one length: no padding between them."""

_REWARD_PATTERN = (1.0, 0.0, 0.5, 0.0)


class StepLawInputs(NamedTuple):
    """The `TrainerContract` fixtures a law on a batch the engine samples takes together (the `step_law_inputs`
    fixture); a law unpacks them in this order."""

    trainer: Trainer
    engine: RolloutEngine
    trainer_version0: TrainResult
    algorithm: AlgorithmSpec
    rl_seed: int
    rl_run: Run[Any]


def sample_groups(
    engine: RolloutEngine,
    adapter: ArtifactRef,
    prompts: Sequence[Prompt],
    seed: int,
    run: Run[Any],
    *,
    stream: str,
    policy_version: int = 0,
    n: int = 4,
    max_tokens: int = 4,
    sampling: SamplingSettings = DEFAULT_SAMPLING,
) -> list[Rollout]:
    """One group of `n` rollouts per prompt, sampled by `engine` from `adapter` at `sampling`, labelled
    `policy_version`; group `gid`'s seed is `derive_seed(stream, seed, gid)`."""
    rollouts: list[Rollout] = []
    for gid, prompt in enumerate(prompts):
        request = RolloutRequest(
            group_id=gid,
            prompt=prompt,
            n=n,
            adapter=adapter,
            policy_version=policy_version,
            seed=derive_seed(stream, seed, gid),
            max_tokens=max_tokens,
            sampling=sampling,
        )
        rollouts.extend(run(engine.generate(request)))
    return rollouts


def sampled_batch(
    engine: RolloutEngine,
    start: TrainResult,
    prompts: Sequence[Prompt],
    seed: int,
    run: Run[Any],
    *,
    n: int = 4,
    max_tokens: int = 4,
) -> TrainBatch:
    """Step 0 from `start` to version 1 on one group of `n` rollouts per prompt, sampled by `engine` from `start`'s
    adapter, with rewards that differ within every group."""
    rollouts = sample_groups(
        engine, start.adapter, prompts, seed, run, stream="conformance.step-reference", n=n, max_tokens=max_tokens
    )
    rewards = [_REWARD_PATTERN[i % n % len(_REWARD_PATTERN)] for i in range(len(rollouts))]
    return TrainBatch(
        step=0,
        rollouts=rollouts,
        rewards=rewards,
        adapter=start.adapter,
        optimizer_state=start.optimizer_state,
        new_version=1,
    )


ENDING_DRAWS = 64
"""Batches a law under `truncated_completions="masked"` may draw for one whose endings it can check: the tiny model
ends about 2% of its completions within 4 tokens, so a single batch often ends none."""


def batch_with_endings(
    engine: RolloutEngine,
    start: TrainResult,
    prompts: Sequence[Prompt],
    seed: int,
    run: Run[Any],
    stops: Collection[int],
    *,
    truncated_too: bool,
    n: int = 4,
    max_tokens: int = 4,
) -> TrainBatch | None:
    """`sampled_batch`'s first batch, on `seed` then on `derive_seed("conformance.endings", seed, k)` for k = 1, 2,
    ... (`ENDING_DRAWS` in all), with a completion that ended at a declared stop id in `stops` and, if
    `truncated_too`, one cut at `max_tokens`; None when no draw has them. Under a declared mask a batch without an
    ended completion trains on nothing, so a law on it would check nothing."""
    for k in range(ENDING_DRAWS):
        draw = seed if k == 0 else derive_seed("conformance.endings", seed, k)
        batch = sampled_batch(engine, start, prompts, draw, run, n=n, max_tokens=max_tokens)
        stopped = ended(batch, stops)
        if any(stopped) and not (truncated_too and all(stopped)):
            return batch
    return None


def law_batch(
    engine: RolloutEngine,
    start: TrainResult,
    prompts: Sequence[Prompt],
    seed: int,
    run: Run[Any],
    algorithm: AlgorithmSpec,
    stops: Collection[int],
    *,
    truncated_too: bool,
    n: int = 4,
    max_tokens: int = 4,
) -> TrainBatch:
    """A trainer law's batch: `sampled_batch` on `seed`, or under `truncated_completions="masked"`
    `batch_with_endings`; the law fails when no draw has the endings it needs."""
    if algorithm.truncated_completions != "masked":
        return sampled_batch(engine, start, prompts, seed, run, n=n, max_tokens=max_tokens)
    found = batch_with_endings(
        engine, start, prompts, seed, run, stops, truncated_too=truncated_too, n=n, max_tokens=max_tokens
    )
    if found is None:
        needed = "both an ended and a truncated completion" if truncated_too else "a completion that ended"
        pytest.fail(
            f"none of {ENDING_DRAWS} batches of {n * len(prompts)} completions (max_tokens={max_tokens}, declared stop "
            f"ids {sorted(stops)}) held {needed}: under truncated_completions='masked' the law needs it to check the "
            "declared mask. Declare the engine's stop ids as its `stop_token_ids` attribute",
            pytrace=False,
        )
    return found


def shifted_batch(batch: TrainBatch, algorithm: AlgorithmSpec) -> TrainBatch:
    """`batch` with each rollout's recorded log-probs moved to the pessimistic side of the trust region (a positive
    advantage's ratio below 1, a negative one's above), where the loss is -r A whatever the clip's epsilon."""
    advantages = reference_advantages(algorithm, [r.group_id for r in batch.rollouts], batch.rewards)
    rollouts = [replace(r, logprobs=_shifted(r, a)) for r, a in zip(batch.rollouts, advantages, strict=True)]
    return replace(batch, rollouts=rollouts)


def ended(batch: TrainBatch, stops: Collection[int]) -> list[bool]:
    """Whether each rollout ended at one of the declared stop ids `stops` (the others were cut at `max_tokens`)."""
    return [bool(r.token_ids) and r.token_ids[-1] in stops for r in batch.rollouts]


def declared_step_loss(
    algorithm: AlgorithmSpec, sampled: TrainBatch, shifted: TrainBatch, stops: Collection[int]
) -> tuple[float, float]:
    """(the declared loss, the size of its terms) of a step on `shifted` whose teacher-forced log-probs are
    `sampled`'s recorded ones. Under `truncated_completions="masked"` only the rollouts that ended at a declared stop
    id in `stops` enter it (numerator and normaliser alike); the advantages are the whole batch's either way (a rollout
    left out of the loss still counts in its group's statistics)."""
    advantages = reference_advantages(algorithm, [r.group_id for r in sampled.rollouts], sampled.rewards)
    kept = ended(sampled, stops) if algorithm.truncated_completions == "masked" else [True] * len(advantages)
    members = [i for i, k in enumerate(kept) if k]
    lengths = [len(sampled.rollouts[i].token_ids) for i in members]
    weights = dict(zip(members, token_weights(algorithm, lengths), strict=True))
    expected = size = 0.0
    for i in members:
        before, after, a, w = sampled.rollouts[i], shifted.rollouts[i], advantages[i], weights[i]
        for new, old in zip(before.logprobs, after.logprobs, strict=True):
            token = token_reference(algorithm, new, old, new, a, 0.2, 0.0)
            expected += w * token.value
            size += abs(w) * (token.magnitude + abs(token.value))
    return expected, size
