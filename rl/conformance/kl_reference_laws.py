"""The KL reference law, mixed into `TrainerContract`: with the KL penalty on and a run that starts from an adapter
that is not zero-initialised, the reference is the declared one, and the KL term at step 0 is what that implies.

Why: a LoRA run that starts from a pretrained adapter (an SFT adapter, a resumed policy) has two candidate references:
the base model (the adapter disabled: free, and right only when the adapter starts at zero) and the starting adapter,
frozen. Which one is a choice (`AlgorithmSpec.kl_reference`); getting the other silently is a bug: TRL PR #6591's
trainer fell back to the base whenever the adapter used `target_parameters`, so the KL penalty pulled a fine-tuned
policy back to the base from the first step. At step 0 the policy is the starting adapter, so the declaration fixes
the KL term: 0 against the starting adapter, and positive against the base (the adapter moved the policy).
"""

from __future__ import annotations

import pytest

from rl.conformance.capabilities import Capabilities, require
from rl.conformance.stop_token_laws import declared_stop_ids
from rl.conformance.support.contract_base import tier
from rl.conformance.support.step_reference import (
    DIGIT_PROMPTS,
    StepLawInputs,
    declared_step_loss,
    law_batch,
    shifted_batch,
)
from rl.conformance.trainer_restore_laws import LOSS_RTOL
from rl.protocols import Trainer
from rl.seeding import derive_seed
from rl.types import StepMetrics, TrainResult

__all__ = ["KlReferenceLaws"]

KL_FLOOR = 1e-6
"""The least mean KL the law takes as "positive": a trained adapter's distance from the base is orders above it (the
tiny model's after 3 steps: ~1e-2), float32 rounding of a zero KL orders below."""


@tier("trainer")
class KlReferenceLaws:
    """Needs `TrainerContract`'s `step_law_inputs` (its `trainer`, `engine`, `trainer_version0`, `algorithm`, `rl_seed`
    and `rl_run`), `another_trainer` and `capabilities`."""

    def test_trainer_kl_at_step_0_from_a_trained_adapter_is_against_the_declared_reference(
        self, step_law_inputs: StepLawInputs, another_trainer: Trainer, capabilities: Capabilities
    ) -> None:
        """A new trainer's first step, from an adapter three steps away from zero, reports a KL (`metrics.kl`) of 0
        and the declared loss without a KL term when the declared reference is that starting adapter, and a positive
        KL when it is the base: a reference that silently became the base (or the policy itself) fails."""
        trainer, engine, trainer_version0, algorithm, rl_seed, rl_run = step_law_inputs
        require(capabilities, "trainer_kl_penalty", "the KL term at step 0 is against the declared reference")
        if algorithm.kl_estimator == "none":
            pytest.skip("AlgorithmSpec(kl_estimator='none') declares no KL penalty, so there is no reference")
        from rl.conformance.trainer_contract import trained_adapter

        seed = derive_seed("conformance.trainer.kl-reference", rl_seed)
        start = TrainResult(
            adapter=trained_adapter(engine, trainer, seed, rl_run),
            optimizer_state=trainer_version0.optimizer_state,
            policy_version=0,
            metrics=StepMetrics(0.0, 0, 0),
        )
        stops = declared_stop_ids(engine)
        sampled = law_batch(engine, start, DIGIT_PROMPTS, seed, rl_run, algorithm, stops, truncated_too=False)
        batch = shifted_batch(sampled, algorithm)
        metrics = rl_run(another_trainer.train_step(batch)).metrics
        if algorithm.kl_reference == "base":
            assert metrics.kl > KL_FLOOR, (
                f"a new trainer's first step from an adapter trained 3 steps away from zero reported KL "
                f"{metrics.kl!r} (loss {metrics.loss!r}), expected > {KL_FLOOR} under AlgorithmSpec(kl_reference="
                "'base'). The reference is the starting adapter (declare kl_reference='initial_adapter'), or the "
                "policy itself (no KL at all)"
            )
            return
        surrogate, size = declared_step_loss(algorithm, sampled, batch, declared_stop_ids(engine))
        assert abs(metrics.kl) <= KL_FLOOR and abs(metrics.loss - surrogate) <= LOSS_RTOL * size, (
            f"a new trainer's first step from an adapter trained 3 steps away from zero reported KL {metrics.kl!r} and "
            f"loss {metrics.loss!r}, expected KL 0 and the surrogate's loss {surrogate!r} (tolerance "
            f"{LOSS_RTOL * size:.3g}) under AlgorithmSpec(kl_reference='initial_adapter'). The reference fell back to "
            "the base model (the adapter disabled): copy the starting adapter as a frozen reference"
        )
