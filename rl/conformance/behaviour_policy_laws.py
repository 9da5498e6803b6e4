"""The behaviour policy of the trainer's off-policy correction, mixed into `TrainerContract`: the step teacher-forces
the distribution the engine sampled (the batch's temperature, top-k and top-p), and a stale batch's loss divides by the
log-probs recorded at sampling, never by log-probs the trainer recomputes.

Why: users sample at T != 1 with a top-p or top-k cut, and pipelined loops train on rollouts one or two versions old.
A trainer that scores at temperature 1 what was sampled at T (TRL before PR #3029), or that replaces the recorded
log-probs with its own recomputation (the ratio is then 1, the clip never bites, and the correction the declaration
promises is gone), trains on a biased objective with no error anywhere. The law moves the recorded log-probs by known
amounts and checks that the reported loss moves exactly as the declared correction (`AlgorithmSpec`) says.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pytest

from rl.conformance.algorithm_spec import AlgorithmSpec, check_spec
from rl.conformance.support.contract_base import Run, tier
from rl.conformance.support.reference import reference_advantages, token_reference, token_weights
from rl.conformance.support.step_reference import DIGIT_PROMPTS, StepLawInputs, sample_groups
from rl.errors import StaleBatchError
from rl.protocols import RolloutEngine
from rl.types import Rollout, SamplingSettings, TrainBatch

__all__ = ["SAMPLINGS", "BehaviourPolicyLaws"]

SAMPLINGS = {
    "temperature": SamplingSettings(temperature=0.6),
    "top_k": SamplingSettings(temperature=0.7, top_k=5),
    "top_p": SamplingSettings(temperature=1.4, top_p=0.8),
}
"""The settings the batches are sampled and trained at: TRL #4159's T = 0.6, and a tempered top-k and top-p cut."""
SHIFTS = (0.3, 0.7)
"""How far (nats) the law moves each recorded log-prob, to the trust region's pessimistic side (raised for A > 0, at
most to 0; lowered for A < 0), where the loss is -r A whatever the clip's epsilon: two amounts, so the loss must
move."""
LOSS_RTOL = 1e-4
"""The reported loss's tolerance relative to the size of its terms (float32 teacher forcing vs the engine's records)."""
_REWARDS = (1.0, 0.0, 0.5, 0.0)


def _sampled(
    engine: RolloutEngine, adapter: Any, sampling: SamplingSettings, seed: int, run: Run[Any]
) -> list[Rollout]:
    """Two groups of four rollouts of the digit task at `sampling`, labelled policy version 0."""
    return sample_groups(engine, adapter, DIGIT_PROMPTS, seed, run, stream="conformance.behaviour", sampling=sampling)


def _moved(rollout: Rollout, advantage: float, shift: float) -> list[float]:
    if advantage > 0:
        return [min(lp + shift, 0.0) for lp in rollout.logprobs]
    return [lp - shift for lp in rollout.logprobs]


def _expected(
    spec: AlgorithmSpec, sampled: Sequence[Rollout], old: Sequence[Sequence[float]], advantages: Sequence[float]
) -> tuple[float, float]:
    """The declared loss with the engine's records as the new log-probs and `old` as the behaviour's, and its size."""
    weights = token_weights(spec, [len(r.token_ids) for r in sampled])
    expected = size = 0.0
    for rollout, olds, a, w in zip(sampled, old, advantages, weights, strict=True):
        for new, behaviour in zip(rollout.logprobs, olds, strict=True):
            token = token_reference(spec, new, behaviour, new, a, 0.2, 0.0)
            expected += w * token.value
            size += abs(w) * (token.magnitude + abs(token.value))
    return expected, size


@tier("trainer")
class BehaviourPolicyLaws:
    """Needs `TrainerContract`'s `step_law_inputs` (its `trainer`, `engine`, `trainer_version0`, `algorithm`, `rl_seed`
    and `rl_run`)."""

    @pytest.mark.parametrize("case", list(SAMPLINGS))
    def test_trainer_teacher_forces_the_distribution_the_batch_was_sampled_from(
        self, step_law_inputs: StepLawInputs, case: str
    ) -> None:
        """Step 0 on rollouts the engine sampled at a temperature (with a top-k or top-p cut), the batch carrying
        those `sampling` settings and the recorded log-probs moved off-policy, reports the declared loss with the
        trainer's log-probs equal to the engine's records: a trainer that teacher-forces at temperature 1 or without
        the cut fails (TRL before PR #3029)."""
        trainer, engine, trainer_version0, algorithm, rl_seed, rl_run = step_law_inputs
        spec = check_spec(algorithm)
        sampling = SAMPLINGS[case]
        sampled = _sampled(engine, trainer_version0.adapter, sampling, rl_seed, rl_run)
        rewards = [_REWARDS[i % 4] for i in range(len(sampled))]
        advantages = reference_advantages(spec, [r.group_id for r in sampled], rewards)
        old = [_moved(r, a, SHIFTS[0]) for r, a in zip(sampled, advantages, strict=True)]
        batch = TrainBatch(
            step=0,
            rollouts=[replace(r, logprobs=o) for r, o in zip(sampled, old, strict=True)],
            rewards=rewards,
            adapter=trainer_version0.adapter,
            optimizer_state=trainer_version0.optimizer_state,
            new_version=1,
            sampling=sampling,
        )
        expected, size = _expected(spec, sampled, old, advantages)
        reported = rl_run(trainer.train_step(batch)).metrics.loss
        assert abs(reported - expected) <= LOSS_RTOL * size, (
            f"step 0 at {sampling} on {len(sampled)} rollouts the engine sampled at those settings, their recorded "
            f"log-probs moved by {SHIFTS[0]} nats, reported loss {reported!r}; {spec.declared()} with the trainer's "
            f"log-probs equal to the engine's gives {expected!r} (tolerance {LOSS_RTOL * size:.3g}). The trainer "
            "teacher-forces another distribution than the batch was sampled from: divide the logits by "
            "`batch.sampling.temperature` (and apply its top-k/top-p cut as `logprob_truncation` declares) before the "
            "log-softmax, for the policy and the reference alike"
        )

    @pytest.mark.parametrize("staleness", [1, 2])
    def test_trainer_stale_loss_divides_by_the_recorded_behaviour_logprobs(
        self, step_law_inputs: StepLawInputs, staleness: int
    ) -> None:
        """A batch `staleness` versions old (sampled at a tempered top-p cut) trained twice, its recorded log-probs
        moved by 0.3 and then by 0.7 nats, reports each time the loss the declared correction gives with those
        records as the behaviour policy: the loss moves exactly as predicted. A trainer that recomputes the
        behaviour log-probs itself (or uses its own detached log-probs) reports one loss for both, and fails.
        Skipped for `importance_ratio="on_policy"` (stale samples never reach that loss), and for a staleness the
        trainer refuses (its bound)."""
        trainer, engine, trainer_version0, algorithm, rl_seed, rl_run = step_law_inputs
        spec = check_spec(algorithm)
        if spec.importance_ratio == "on_policy":
            pytest.skip("importance_ratio='on_policy' declares that stale samples never reach the loss")
        sampling = SAMPLINGS["top_p"]
        sampled = _sampled(engine, trainer_version0.adapter, sampling, rl_seed, rl_run)
        rewards = [_REWARDS[i % 4] for i in range(len(sampled))]
        advantages = reference_advantages(spec, [r.group_id for r in sampled], rewards)
        reported: list[float] = []
        expected: list[float] = []
        size = 0.0
        for shift in SHIFTS:
            old = [_moved(r, a, shift) for r, a in zip(sampled, advantages, strict=True)]
            # The adapter trained is the one sampled from, labelled `staleness` versions newer than the rollouts: the
            # trainer's log-probs are then the engine's records, and only the behaviour log-probs move.
            batch = TrainBatch(
                step=staleness,
                rollouts=[replace(r, logprobs=o) for r, o in zip(sampled, old, strict=True)],
                rewards=rewards,
                adapter=trainer_version0.adapter,
                optimizer_state=trainer_version0.optimizer_state,
                new_version=staleness + 1,
                sampling=sampling,
            )
            try:
                reported.append(rl_run(trainer.train_step(batch)).metrics.loss)
            except StaleBatchError as exc:
                pytest.skip(f"the trainer refuses rollouts {staleness} versions old (its staleness bound): {exc}")
            want, part = _expected(spec, sampled, old, advantages)
            expected.append(want)
            size = max(size, part)
        tolerance = LOSS_RTOL * size
        moved, predicted = reported[1] - reported[0], expected[1] - expected[0]
        recomputed = abs(moved) <= tolerance
        assert all(abs(r - e) <= tolerance for r, e in zip(reported, expected, strict=True)) and (
            abs(moved - predicted) <= 2 * tolerance
        ), (
            f"a batch {staleness} versions old at {sampling}, its recorded log-probs moved by {SHIFTS[0]} and by "
            f"{SHIFTS[1]} nats, reported losses {reported}; {spec.declared()} with those records as the behaviour "
            f"policy gives {expected} (a change of {predicted!r}, reported {moved!r}; tolerance {tolerance:.3g})."
            + (
                " The loss did not move: the trainer replaced the recorded log-probs with its own (recomputed, or its "
                "new log-probs detached). Use `rollout.logprobs` as the old log-probs of the ratio"
                if recomputed
                else " The trainer's correction is not the declared one, or not against the recorded log-probs"
            )
        )
