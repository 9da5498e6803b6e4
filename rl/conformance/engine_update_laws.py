"""Engine laws on its state after an update, mixed into `RolloutEngineContract`: once the trainer publishes version
v + 1, every later request for it gets v + 1's distribution, whatever the engine held for v.

Why: an engine keeps state across requests (a prefix or KV cache of the prompts it served, adapters loaded by name or
path, weights kept through `close` or a sleep), and state left from v silently turns on-policy rollouts into
rollouts of a policy the trainer no longer has: the loss's ratio then corrects towards the wrong distribution, and
nothing fails. TRL's vLLM sleep mode did it (huggingface/trl#5312: after wake-up, rollouts came from the weights
loaded before the sleep).

The reference is an engine that never held v: a second engine on the same store (`cold_engine`), sent the same
seeded request, samples from v + 1's distribution and nothing else. The warm engine must give the same tokens and the
same log-probs (within `LOGPROB_TOLERANCE`), so both its samples and the log-probs the loss corrects with are v + 1's.
"""

from __future__ import annotations

import inspect
from dataclasses import replace
from typing import Any

import pytest

from rl.conformance.sampler_fidelity_laws import first_difference
from rl.conformance.support.contract_base import Run, must_provide, tier
from rl.errors import EngineClosedError
from rl.protocols import RolloutEngine
from rl.types import ArtifactRef, RolloutRequest

__all__ = ["EngineUpdateLaws"]

PAUSES = {"sleep": "wake_up", "close": ""}
"""How an engine is paused, and resumed, in the order the law pauses it: vLLM's `sleep()`, then `wake_up()`;
`close()`, then used again."""


def _call(method: Any, rl_run: Run[Any]) -> None:
    result = method()
    if inspect.isawaitable(result):
        rl_run(result)


@tier("engine")
class EngineUpdateLaws:
    """Needs the `engine`, `rollout_request`, `other_adapter` and `rl_run` fixtures of `RolloutEngineContract`, and
    `cold_engine`."""

    @pytest.fixture
    def cold_engine(self) -> RolloutEngine:
        """Return a second engine of the kind under test, on the `artifacts` store, that has served nothing yet."""
        raise must_provide(
            "RolloutEngineContract",
            "cold_engine",
            "a second, fresh RolloutEngine of the kind under test on the `artifacts` store (the reference that never "
            "held an older version)",
        )

    def test_engine_serves_a_new_version_of_a_prompt_it_served_as_a_fresh_engine_does(
        self,
        engine: RolloutEngine,
        cold_engine: RolloutEngine,
        rollout_request: RolloutRequest,
        other_adapter: ArtifactRef,
        rl_run: Run[Any],
    ) -> None:
        """A prompt served under version v (the `adapter` fixture), then requested under v + 1 (`other_adapter`, the
        fork's own trainer's, named and placed as it places them), gets the group a fresh engine gives for v + 1:
        the same tokens and log-probs. A prefix or KV cache keyed by the prompt without the adapter, or an adapter
        cached by its name or path, fails; so does the reverse, v requested again after v + 1."""
        newer = replace(rollout_request, adapter=other_adapter)
        warm_old = rl_run(engine.generate(rollout_request))
        warm_new = rl_run(engine.generate(newer))
        cold_new = rl_run(cold_engine.generate(newer))
        difference = first_difference(warm_new, cold_new)
        assert difference is None, (
            f"after serving prompt {rollout_request.prompt.question!r} with adapter "
            f"{rollout_request.adapter.digest[:19]}, the engine served it with adapter {other_adapter.digest[:19]} "
            f"with {difference} a fresh engine gives: "
            "state from the older version (a prefix or KV cache keyed without the adapter, an adapter cached by name "
            "or path) reached the newer one. Key every cache by the adapter's digest"
        )
        cold_old = rl_run(cold_engine.generate(rollout_request))
        difference = first_difference(warm_old, cold_old)
        assert difference is None, (
            f"after serving adapter {other_adapter.digest[:19]}, a fresh engine served adapter "
            f"{rollout_request.adapter.digest[:19]} with {difference} the first engine gave: state from one version "
            "reached another"
        )

    def test_engine_paused_and_resumed_serves_a_version_published_meanwhile(
        self,
        engine: RolloutEngine,
        cold_engine: RolloutEngine,
        rollout_request: RolloutRequest,
        other_adapter: ArtifactRef,
        rl_run: Run[Any],
    ) -> None:
        """An engine that served version v, then was put to sleep and woken (where it has vLLM's `sleep` and
        `wake_up`) or closed and used again, serves v + 1 as a fresh engine does (or refuses after `close` with
        `rl.errors.EngineClosedError`): weights kept through the pause must not stand in for the update
        (huggingface/trl#5312). v + 1 is an adapter the engine never loaded at its first pause; each further pause
        checks it again."""
        pauses = [(pause, resume) for pause, resume in PAUSES.items() if _has(engine, pause, resume)]
        if not pauses:
            pytest.skip(f"{type(engine).__name__} has neither sleep() and wake_up() nor close(): nothing pauses it")
        newer = replace(rollout_request, adapter=other_adapter)
        cold_new = rl_run(cold_engine.generate(newer))
        for pause, resume in pauses:
            rl_run(engine.generate(rollout_request))
            _call(getattr(engine, pause), rl_run)
            if resume:
                _call(getattr(engine, resume), rl_run)
            try:
                got = rl_run(engine.generate(newer))
            except EngineClosedError:
                if pause == "close":
                    continue
                raise
            difference = first_difference(got, cold_new)
            assert difference is None, (
                f"served adapter {rollout_request.adapter.digest[:19]}, then {pause}"
                f"{f' and {resume}' if resume else ''}, the engine served adapter {other_adapter.digest[:19]} with "
                f"{difference} a fresh engine gives: what it held before the pause stood in for the newer version. "
                "Load the adapter each request names after a pause, never the weights resident before it"
            )


def _has(engine: RolloutEngine, pause: str, resume: str) -> bool:
    return callable(getattr(engine, pause, None)) and (not resume or callable(getattr(engine, resume, None)))
