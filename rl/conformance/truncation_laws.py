"""The truncated-completion law, mixed into `TrainerContract`: a completion cut at `max_tokens` enters the loss as
`AlgorithmSpec.truncated_completions` declares, in the numerator and the normaliser alike.

Why: leaving truncated completions out of the loss (TRL's `mask_truncated_completions`, DAPO's overlong filtering) is a
choice; doing it halfway is a bug. A mask applied to the token losses but not to the count they are divided by shrinks
every step by the share of truncated completions, which grows as completions lengthen, and nothing errs. And a
completion is truncated only if it did not end at a stop id: code that asks only `eos_token_id` masks the completions
that ended on a secondary stop (TRL PR #7039: Phi-3.5's `<|end|>` read as truncated, `clipped_ratio` 0.97). The law
reads the stop ids from the engine's declaration (`rl.conformance.stop_token_laws.declared_stop_ids`).
"""

from __future__ import annotations

from rl.conformance.stop_token_laws import declared_stop_ids
from rl.conformance.support.contract_base import tier
from rl.conformance.support.step_reference import (
    DIGIT_PROMPTS,
    StepLawInputs,
    declared_step_loss,
    ended,
    law_batch,
    shifted_batch,
)
from rl.conformance.trainer_restore_laws import LOSS_RTOL
from rl.seeding import derive_seed

__all__ = ["TruncationLaws"]

MAX_TOKENS = 4
"""Short enough that most of the tiny model's completions are cut, long enough that some stop."""
GROUP = 8


@tier("trainer")
class TruncationLaws:
    """Needs `TrainerContract`'s `step_law_inputs` (its `trainer`, `engine`, `trainer_version0`, `algorithm`, `rl_seed`
    and `rl_run`)."""

    def test_trainer_masks_truncated_completions_as_declared(self, step_law_inputs: StepLawInputs) -> None:
        """Step 0 on completions some of which were cut at `max_tokens` (their last token no declared stop id) reports
        the declared loss with those completions kept, or left out of both the token sum and its normaliser: a mask
        on one side only, or a stop read from `eos_token_id` alone, fails."""
        trainer, engine, trainer_version0, algorithm, rl_seed, rl_run = step_law_inputs
        stops = declared_stop_ids(engine)
        seed = derive_seed("conformance.trainer.truncation", rl_seed)
        sampled = law_batch(
            engine, trainer_version0, DIGIT_PROMPTS, seed, rl_run, algorithm, stops, truncated_too=True, n=GROUP,
            max_tokens=MAX_TOKENS,
        )  # fmt: skip
        stopped = ended(sampled, stops)
        batch = shifted_batch(sampled, algorithm)
        expected, size = declared_step_loss(algorithm, sampled, batch, stops)
        reported = rl_run(trainer.train_step(batch)).metrics.loss
        truncated = stopped.count(False)
        assert abs(reported - expected) <= LOSS_RTOL * size, (
            f"step 0 on {len(stopped)} completions, {truncated} of them truncated at max_tokens={MAX_TOKENS} (no "
            f"declared stop id {sorted(stops)} at their end), reported loss {reported!r}; "
            f"AlgorithmSpec(truncated_completions={algorithm.truncated_completions!r}) gives {expected!r} (tolerance "
            f"{LOSS_RTOL * size:.3g}). A truncated completion is either trained like any other or left out of the "
            "token sum and of the count it is divided by, both; and a completion that ended at any declared stop id "
            "is not truncated"
        )
