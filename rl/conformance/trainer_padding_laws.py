"""The trainer's batching law, mixed into `TrainerContract`: a step on completions of prompts of other lengths
teacher-forces each completion as if it were alone.

Why: the trainer pads its batch too, and TRL PR #3722's bug was there as much as in the sampler: prompts padded on the
right and completions appended put PAD between the shorter prompt and its completion, so the trainer's log-probs of
that completion are of another context than the one sampled, and the importance ratio is wrong for every token of it.
The trainer laws' usual batch has prompts of one length, which no padding touches. `rl.conformance.batch_padding_laws`
holds the engine's side of the same law.
"""

from __future__ import annotations

from rl.conformance.batch_padding_laws import PROMPTS_OF_OTHER_LENGTHS
from rl.conformance.stop_token_laws import declared_stop_ids
from rl.conformance.support.contract_base import tier
from rl.conformance.support.step_reference import (
    StepLawInputs,
    declared_step_loss,
    law_batch,
    shifted_batch,
)
from rl.conformance.trainer_restore_laws import LOSS_RTOL
from rl.seeding import derive_seed

__all__ = ["TrainerPaddingLaws"]


@tier("trainer")
class TrainerPaddingLaws:
    """Needs `TrainerContract`'s `step_law_inputs` (its `trainer`, `engine`, `trainer_version0`, `algorithm`, `rl_seed`
    and `rl_run`)."""

    def test_trainer_step_on_prompts_of_other_lengths_computes_the_declared_loss(
        self, step_law_inputs: StepLawInputs
    ) -> None:
        """Step 0 on groups whose prompts differ in length, each in either order, reports the loss the declared
        `AlgorithmSpec` gives with the trainer's log-probs equal to the engine's: padding between a prompt and its
        completion (or positions counted from the pads) moves the shorter prompt's log-probs and fails."""
        trainer, engine, trainer_version0, algorithm, rl_seed, rl_run = step_law_inputs
        stops = declared_stop_ids(engine)
        seed = derive_seed("conformance.trainer.padding", rl_seed)
        for order in (PROMPTS_OF_OTHER_LENGTHS, PROMPTS_OF_OTHER_LENGTHS[::-1]):
            sampled = law_batch(engine, trainer_version0, order, seed, rl_run, algorithm, stops, truncated_too=True)
            batch = shifted_batch(sampled, algorithm)
            expected, size = declared_step_loss(algorithm, sampled, batch, stops)
            reported = rl_run(trainer.train_step(batch)).metrics.loss
            lengths = [len(r.prompt_token_ids) for r in batch.rollouts]
            assert abs(reported - expected) <= LOSS_RTOL * size, (
                f"step 0 on prompts {[p.question for p in order]} (prompt lengths {sorted(set(lengths))}) reported "
                f"loss {reported!r}; {algorithm.declared()} on the engine's log-probs gives {expected!r} (tolerance "
                f"{LOSS_RTOL * size:.3g}). The trainer teacher-forces a completion of a shorter prompt in another "
                "context than it was sampled in: pad the batch on the left behind an attention mask, or on the right "
                "after each whole prompt + completion, never between a prompt and its completion"
            )
