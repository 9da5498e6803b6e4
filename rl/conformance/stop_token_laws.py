"""The stop-token law, mixed into `RolloutEngineContract`: a completion ends at the first of its declared stop ids,
whichever it is, not only at `eos_token_id`.

Why: many models declare several end ids (`generation_config.eos_token_id` as a list: Phi-3.5's `<|end|>` beside
`<|endoftext|>`, gemma-3's `<end_of_turn>` beside `<eos>`, Qwen3's two). The sampler stops at any of them, and code
that checks only the tokenizer's `eos_token_id` then keeps what follows a secondary stop in the loss, or counts a
completion that ended as truncated (TRL PR #7039). An engine declares its stop ids as its `stop_token_ids` attribute
(defaults to `(eos_token_id,)`); a completion holds no declared stop id before its last token, and one shorter than
`max_tokens` ends with one. `rl.conformance.truncation_laws` reads the same declaration in the trainer's law.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pytest

from rl.conformance.support.contract_base import Run, tier
from rl.protocols import RolloutEngine
from rl.types import RolloutRequest

__all__ = ["StopTokenLaws", "declared_stop_ids"]


def declared_stop_ids(engine: RolloutEngine) -> frozenset[int]:
    """The ids an engine declares its completions end at: its `stop_token_ids` attribute, else its `eos_token_id`,
    else none."""
    stops = getattr(engine, "stop_token_ids", None)
    if stops is None:
        eos = getattr(engine, "eos_token_id", None)
        stops = () if eos is None else (eos,)
    return frozenset(int(s) for s in stops)


@tier("engine")
class StopTokenLaws:
    """Needs the `engine`, `rollout_request` and `rl_run` fixtures of `RolloutEngineContract`."""

    @pytest.fixture
    def stop_token_ids(self, engine: RolloutEngine) -> Sequence[int]:
        """The ids the engine's completions end at (every one the model declares); defaults to the engine's
        `stop_token_ids` attribute, else `(eos_token_id,)`; empty (the law skips) when it has neither."""
        return sorted(declared_stop_ids(engine))

    def test_engine_completion_ends_at_its_first_declared_stop_id(
        self, engine: RolloutEngine, rollout_request: RolloutRequest, stop_token_ids: Sequence[int], rl_run: Run[Any]
    ) -> None:
        """No completion holds a declared stop id before its last token, and every completion shorter than
        `max_tokens` ends with one (any of them, not only `eos_token_id`)."""
        if not stop_token_ids:
            pytest.skip("the engine declares no stop ids (no `stop_token_ids` or `eos_token_id` attribute)")
        stops = set(stop_token_ids)
        request = replace(rollout_request, n=16, max_tokens=6)
        for i, r in enumerate(rl_run(engine.generate(request))):
            early = [t for t, token in enumerate(r.token_ids[:-1]) if token in stops]
            assert not early, (
                f"rollout {i} holds the declared stop id {r.token_ids[early[0]]} at position {early[0]} of its "
                f"{len(r.token_ids)} tokens {r.token_ids}: a completion ends at the first of its declared stop ids "
                f"{sorted(stops)}, whichever it is. Stop the sequence (and cut its tokens) at any of them, not only at "
                "eos_token_id"
            )
            assert len(r.token_ids) == request.max_tokens or (r.token_ids and r.token_ids[-1] in stops), (
                f"rollout {i} has {len(r.token_ids)} < max_tokens={request.max_tokens} tokens {r.token_ids} and does "
                f"not end with a declared stop id {sorted(stops)}: a completion that stopped early stopped at one"
            )
