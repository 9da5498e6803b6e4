"""The prompt's special-token law, mixed into `RolloutEngineContract`: a prompt begins with the BOS its template
declares, once.

Why: a chat template that writes its own BOS into the text, tokenized by a tokenizer that prepends another
(`add_special_tokens=True`, vLLM's default), gives every prompt two BOS tokens. Nothing fails: the model samples from a
context it was never tuned on, the recorded log-probs are of that context, and the trainer teacher-forces the same
ids, so every other law agrees with itself. Only the ids show it. An engine declares the BOS its prompts begin with as
its `bos_token_id` attribute (None, or no attribute, for a template that declares none: Qwen's).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from rl.conformance.support.contract_base import Run, tier
from rl.protocols import RolloutEngine
from rl.types import Prompt, RolloutRequest

__all__ = ["PromptTokenLaws"]

PROMPTS = (Prompt("3=", "4"), Prompt("12+34=", "46"))
"""Two questions of other lengths, in the tiny model's alphabet."""


@tier("engine")
class PromptTokenLaws:
    """Needs the `engine`, `rollout_request` and `rl_run` fixtures of `RolloutEngineContract`."""

    @pytest.fixture
    def bos_token_id(self, engine: RolloutEngine) -> int | None:
        """The BOS id every prompt begins with, once, as the engine's template declares it; defaults to the engine's
        `bos_token_id` attribute (None when it has none: the law then skips)."""
        bos = getattr(engine, "bos_token_id", None)
        return None if bos is None else int(bos)

    def test_engine_prompt_begins_with_its_declared_bos_once(
        self, engine: RolloutEngine, rollout_request: RolloutRequest, bos_token_id: int | None, rl_run: Run[Any]
    ) -> None:
        """Every rollout's `prompt_token_ids` begin with exactly one declared BOS: a template that writes its BOS and a
        tokenizer that adds another (two at the start) fails, and so does a prompt sent without it. Later ones are the
        template's (SmolLM2's BOS, `<|im_start|>`, also opens each turn)."""
        if bos_token_id is None:
            pytest.skip("the engine declares no `bos_token_id`, so its prompts carry no BOS to count")
        for prompt in PROMPTS:
            group = rl_run(engine.generate(replace(rollout_request, prompt=prompt, n=2, max_tokens=1)))
            for i, r in enumerate(group):
                ids = list(r.prompt_token_ids)
                count = next((n for n, t in enumerate(ids) if t != bos_token_id), len(ids))  # the leading run
                assert count == 1, (
                    f"rollout {i} of the prompt {prompt.question!r} has prompt ids {ids[:8]}..., beginning with the "
                    f"declared BOS {bos_token_id} {count} time(s): a prompt begins with its template's BOS exactly "
                    "once. Two: the chat template writes the BOS and "
                    "the tokenizer adds another (encode the rendered template with add_special_tokens=False); none: "
                    "the BOS was dropped"
                )
