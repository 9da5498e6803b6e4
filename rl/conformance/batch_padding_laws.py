"""The engine's batching law, mixed into `RolloutEngineContract`: requests whose prompts have other lengths, sampled in
one call, each get what the request gets alone.

Why: a batch of prompts of different lengths is padded, and the padding must be invisible: on the left, behind an
attention mask, with positions counted from each row's first real token. Padded on the wrong side, the shorter prompt
decodes after its pads (TRL PR #3722: right-padded prompts put PAD between prompt and completion), and its samples and
their log-probs are of another context, with no error anywhere. One request alone is never padded, so a law that sends
one request at a time cannot see it. `rl.conformance.trainer_padding_laws` holds the trainer's side of the same law.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from rl.conformance.sampler_fidelity_laws import _concurrently, first_difference
from rl.conformance.support.contract_base import Run, tier
from rl.protocols import RolloutEngine
from rl.types import Prompt, RolloutRequest

__all__ = ["PROMPTS_OF_OTHER_LENGTHS", "BatchPaddingLaws"]

PROMPTS_OF_OTHER_LENGTHS = (Prompt("3=", "4"), Prompt("12+34=", "46"))
"""Two questions whose prompts differ in length by four tokens on the tiny model's character tokenizer."""


@tier("engine")
class BatchPaddingLaws:
    """Needs the `engine`, `rollout_request` and `rl_run` fixtures of `RolloutEngineContract`."""

    def test_engine_prompts_of_other_lengths_in_one_call_sample_as_alone(
        self, engine: RolloutEngine, rollout_request: RolloutRequest, rl_run: Run[Any]
    ) -> None:
        """Requests for prompts of other lengths sent in one call (`generate_groups`, or concurrently), in either
        order, each get the tokens and log-probs that request gets alone: padding, on whichever side, is invisible."""
        requests = [
            replace(rollout_request, group_id=rollout_request.group_id + g, prompt=prompt)
            for g, prompt in enumerate(PROMPTS_OF_OTHER_LENGTHS)
        ]
        alone = {r.group_id: rl_run(engine.generate(r)) for r in requests}
        for order in (requests, requests[::-1]):
            together = rl_run(_concurrently(engine, order))
            assert len(together) == len(order), f"one call of {len(order)} requests returned {len(together)} groups"
            for request, group in zip(order, together, strict=True):
                difference = first_difference(group, alone[request.group_id])
                assert difference is None, (
                    f"in one call with the prompts {[r.prompt.question for r in order]} (prompt lengths "
                    f"{[len(g[0].prompt_token_ids) if g else None for g in together]}), the request for "
                    f"{request.prompt.question!r} got {difference} it gets alone: the batch's padding reached the "
                    "model. Pad prompts on the left behind an attention mask, with positions counted from each row's "
                    "first real token, and never between a prompt and its completion"
                )
