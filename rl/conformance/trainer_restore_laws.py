"""The trainer's restore, staleness and algorithm-fidelity laws, mixed into `TrainerContract`.

A step continued in memory (a trainer that keeps its model and optimizer warm between steps, as ours does) must give
the bits a step restored from the artifacts gives: after a crash, a retry on another machine or a resume, only the
artifacts exist, so a save that loses anything (moments rounded to save space, the step count dropped) silently turns a
resumed run into another run. And the trainer must refuse a batch its staleness bound excludes, with the typed error
the driver and its callers catch, not train on it. And the step must compute, on log-probs it teacher-forces, the loss
its `AlgorithmSpec` declares: the advantage and loss laws check the functions a fork binds, not what its trainer runs.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from rl.conformance.algorithm_spec import AlgorithmSpec
from rl.conformance.stop_token_laws import declared_stop_ids
from rl.conformance.support.contract_base import Run, tier
from rl.conformance.support.reference import reference_advantages, token_reference, token_weights
from rl.errors import StaleBatchError
from rl.protocols import Trainer
from rl.types import Rollout, TrainBatch, TrainResult

__all__ = ["TrainerRestoreLaws"]

STALE_BATCHES = {
    # (the version the batch's rollouts claim, the version trained): far older than any bound, and newer than trained
    "older-than-any-bound": (0, 1000),
    "newer-than-trained": (5, 0),
}


GAIN_SHIFT = 0.5
"""How far the law raises a positive-advantage token's recorded log-prob (at most to 0): its ratio falls below 1."""
LOSS_SHIFT = 0.5
"""How far the law lowers a negative-advantage token's recorded log-prob: its ratio is e^0.5, above 1. Both sides are
the trust region's pessimistic side, where the loss is -r A whatever the clip's epsilon."""
LOSS_RTOL = 1e-4
"""The reported loss's tolerance relative to the size of its terms: the trainer's teacher-forced log-probs and the
engine's recorded ones agree to float32 rounding, not bit for bit (another batch shape, no KV cache)."""


def _shifted(rollout: Rollout, advantage: float) -> list[float]:
    if advantage > 0:
        return [lp + min(GAIN_SHIFT, -lp) for lp in rollout.logprobs]
    return [lp - LOSS_SHIFT for lp in rollout.logprobs]


def _digests(result: TrainResult) -> dict[str, str]:
    return {"adapter": result.adapter.digest, "optimizer state": result.optimizer_state.digest}


@tier("trainer")
class TrainerRestoreLaws:
    """Needs `trainer`, `another_trainer`, `train_batch`, `algorithm` and `rl_run` (`TrainerContract`'s fixtures)."""

    def test_trainer_a_step_restored_from_its_artifacts_equals_the_step_continued_in_memory(
        self, trainer: Trainer, another_trainer: Trainer, train_batch: TrainBatch, rl_run: Run[Any]
    ) -> None:
        """Step 1 run by the trainer that just ran step 0, and by a new trainer that has only step 0's artifacts
        (adapter and optimizer state), give bitwise-identical artifacts: nothing a resume needs lives only in memory."""
        v1 = rl_run(trainer.train_step(train_batch))
        second = replace(train_batch, step=1, adapter=v1.adapter, optimizer_state=v1.optimizer_state, new_version=2)
        continued = rl_run(trainer.train_step(second))
        restored = rl_run(another_trainer.train_step(second))
        assert _digests(restored) == _digests(continued), (
            f"step 1 continued in memory gave {_digests(continued)}; restored from step 0's artifacts in a new "
            f"trainer it gave {_digests(restored)}. The artifacts do not hold everything the step uses (optimizer "
            "moments or step count saved with less precision, or missing; state kept only in the process): a resumed "
            "or retried run diverges from the one that did not stop. Save exactly what the next step reads"
        )

    def test_trainer_step_computes_the_declared_loss_on_teacher_forced_logprobs(
        self,
        trainer: Trainer,
        train_batch: TrainBatch,
        algorithm: AlgorithmSpec,
        rl_run: Run[Any],
        request: pytest.FixtureRequest,
    ) -> None:
        """Step 0 (version 0, the reference policy: no KL) on its engine's rollouts with their recorded log-probs moved
        off-policy reports the loss the declared `AlgorithmSpec` gives (advantages, aggregation, ratio, dual clip) in
        float64, with the trainer's log-probs equal to the engine's: another scale, aggregation or teacher forcing
        (a temperature, a shifted position) fails."""
        advantages = reference_advantages(algorithm, [r.group_id for r in train_batch.rollouts], train_batch.rewards)
        rollouts = [replace(r, logprobs=_shifted(r, a)) for r, a in zip(train_batch.rollouts, advantages, strict=True)]
        batch = replace(train_batch, rollouts=rollouts)
        masked = algorithm.truncated_completions == "masked"  # leaves out what ended at none of the engine's stop ids
        stops = declared_stop_ids(request.getfixturevalue("engine")) if masked else frozenset()
        kept = [not masked or (bool(r.token_ids) and r.token_ids[-1] in stops) for r in rollouts]
        members = [(b, r, a) for b, r, a, k in zip(train_batch.rollouts, rollouts, advantages, kept, strict=True) if k]
        weights = token_weights(algorithm, [len(r.token_ids) for _, r, _ in members])
        expected = size = 0.0
        for (before, after, a), w in zip(members, weights, strict=True):
            for new, old in zip(before.logprobs, after.logprobs, strict=True):
                token = token_reference(algorithm, new, old, new, a, 0.2, 0.0)
                expected += w * token.value
                size += abs(w) * (token.magnitude + abs(token.value))
        reported = rl_run(trainer.train_step(batch)).metrics.loss
        assert abs(reported - expected) <= LOSS_RTOL * size, (
            f"step 0 on {len(rollouts)} rollouts with advantages {[round(a, 6) for a in advantages]} and ratios "
            f"e^-{GAIN_SHIFT} (A > 0) and e^{LOSS_SHIFT} (A < 0) against the engine's log-probs reported loss "
            f"{reported!r}; {algorithm.declared()} gives {expected!r} (tolerance {LOSS_RTOL * size:.3g}). The trainer "
            "computes another advantage scale or aggregation than it declares, or its teacher-forced log-probs are not "
            "the engine's (another temperature, an off-by-one position). Report as `metrics.loss` the loss the step "
            "back-propagates"
        )

    @pytest.mark.parametrize("case", list(STALE_BATCHES))
    def test_trainer_refuses_a_batch_outside_its_staleness_bound(
        self, trainer: Trainer, train_batch: TrainBatch, case: str, rl_run: Run[Any]
    ) -> None:
        """A batch whose rollouts claim a policy version 1000 versions older than the one trained, or newer than it,
        is refused with `rl.errors.StaleBatchError` (the driver's and its callers' type), never trained on."""
        claimed, trained = STALE_BATCHES[case]
        rollouts = [replace(r, policy_version=claimed) for r in train_batch.rollouts]
        batch = replace(train_batch, rollouts=rollouts, new_version=trained + 1)
        try:
            result = rl_run(trainer.train_step(batch))
        except StaleBatchError:
            return
        except Exception as exc:
            pytest.fail(
                f"training version {trained} on rollouts of version {claimed} ({case}) raised "
                f"{type(exc).__name__}: {exc}; raise rl.errors.StaleBatchError "
                "(rl.algorithm.checks.check_staleness does), the type the driver handles",
                pytrace=False,
            )
        pytest.fail(
            f"the trainer trained version {trained} on rollouts of version {claimed} ({case}) and returned adapter "
            f"version {result.policy_version}: a batch outside any staleness bound was not refused. Check every "
            "rollout with rl.algorithm.checks.check_staleness (StaleBatchError) before the step",
            pytrace=False,
        )
