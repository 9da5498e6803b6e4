"""The laws of `rl.protocols.RolloutEngine`: seeded, labelled groups with the sampling log-prob of every token."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pytest

from rl.conformance.batch_padding_laws import BatchPaddingLaws
from rl.conformance.capabilities import Capabilities, require
from rl.conformance.engine_lifetime_laws import EngineLifetimeLaws
from rl.conformance.engine_update_laws import EngineUpdateLaws
from rl.conformance.law_sizes import LawSizes
from rl.conformance.prompt_token_laws import PromptTokenLaws
from rl.conformance.sampler_fidelity_laws import SamplerFidelityLaws, first_difference
from rl.conformance.stop_token_laws import StopTokenLaws
from rl.conformance.support.contract_base import ContractBase, Run, must_provide, tier
from rl.conformance.truncated_sampling_laws import TruncatedSamplingLaws
from rl.deploy.simulated.artifacts import MemoryArtifacts
from rl.protocols import Artifacts, RolloutEngine
from rl.seeding import derive_seed
from rl.types import ArtifactRef, Prompt, Rollout, RolloutRequest

__all__ = ["RolloutEngineContract"]


def _describe_difference(a: Sequence[Rollout], b: Sequence[Rollout]) -> str:
    if len(a) != len(b):
        return f"{len(a)} rollouts, then {len(b)}"
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        dx, dy = x.to_dict(), y.to_dict()
        for key in dx:
            if dx[key] != dy[key]:
                return f"rollout {i} differs in {key}: {dx[key]!r} then {dy[key]!r}"
    return "no difference"


@tier("engine")
class RolloutEngineContract(
    SamplerFidelityLaws,
    EngineLifetimeLaws,
    TruncatedSamplingLaws,
    PromptTokenLaws,
    StopTokenLaws,
    BatchPaddingLaws,
    EngineUpdateLaws,
    ContractBase,
):
    """Laws of `rl.protocols.RolloutEngine`: seeded, labelled groups with the sampling log-prob of every token, the
    log-probs of the distribution sampled (`rl.conformance.sampler_fidelity_laws`), each request served its own adapter,
    completions that end at their first end-of-sequence token, groups whose seeds share no samples and a lifetime past
    `close` (`rl.conformance.engine_lifetime_laws`).

    Provide `engine` and `adapter`; `artifacts` (the store both share) defaults to an in-memory store, `prompt` and
    `rollout_request` can be overridden when your engine needs another prompt or group size, and `law_sizes` when a
    forward pass is too dear for the sampling laws' full draws.
    """

    @pytest.fixture
    def artifacts(self) -> Artifacts:
        """The artifact store `engine` and `adapter` share; defaults to an in-memory store (override to use yours)."""
        return MemoryArtifacts()

    @pytest.fixture
    def engine(self) -> RolloutEngine:
        """Return the `rl.protocols.RolloutEngine` under test, able to sample from the `adapter` fixture's adapter."""
        raise must_provide(
            "RolloutEngineContract",
            "engine",
            "the RolloutEngine under test, reading adapters from the `artifacts` fixture's store",
        )

    @pytest.fixture
    def adapter(self) -> ArtifactRef:
        """Return the `ArtifactRef` of a version-0 adapter `engine` can sample from, stored in the `artifacts` fixture's
        store (e.g. `rl_run(MyTrainer(artifacts).init_adapter(0)).adapter`)."""
        raise must_provide(
            "RolloutEngineContract",
            "adapter",
            "the ArtifactRef of a version-0 adapter the engine can sample, e.g. "
            "rl_run(trainer.init_adapter(0)).adapter on the `artifacts` store",
        )

    @pytest.fixture
    def eos_token_id(self, engine: RolloutEngine) -> int | None:
        """The end-of-sequence token id the engine stops at; defaults to the engine's `eos_token_id` attribute (None
        when it has none: then the end-of-sequence law checks only the length and the log-probs)."""
        eos = getattr(engine, "eos_token_id", None)
        return None if eos is None else int(eos)

    @pytest.fixture
    def law_sizes(self) -> LawSizes:
        """The share of their groups the sampling laws draw (`rl.conformance.law_sizes.LawSizes`); defaults to all."""
        return LawSizes()

    @pytest.fixture
    def prompt(self) -> Prompt:
        """The prompt the laws sample from; defaults to the digit task's `Prompt("3=", "4")`."""
        return Prompt(question="3=", answer="4")

    @pytest.fixture
    def rollout_request(self, prompt: Prompt, adapter: ArtifactRef, rl_seed: int) -> RolloutRequest:
        """The request the laws send: group 3 of 8 samples, labelled policy version 2 (so defaults cannot pass)."""
        return RolloutRequest(
            group_id=3,
            prompt=prompt,
            n=8,
            adapter=adapter,
            policy_version=2,
            seed=derive_seed("conformance.engine", rl_seed),
            max_tokens=4,
        )

    @pytest.fixture
    def other_adapter(self) -> ArtifactRef:
        """Return the `ArtifactRef` of a second adapter, stored in the `artifacts` store, whose samples or their
        log-probs differ from the `adapter` fixture's for the same request (e.g. the adapter after a few training
        steps; note that a fresh LoRA adapter's B matrix is zero, so two version-0 adapters sample alike)."""
        raise must_provide(
            "RolloutEngineContract",
            "other_adapter",
            "the ArtifactRef of a second adapter that samples differently from `adapter` (e.g. one a few training "
            "steps on), stored in the `artifacts` store",
        )

    def test_engine_same_request_gives_same_rollouts(
        self, engine: RolloutEngine, rollout_request: RolloutRequest, rl_run: Run[Any]
    ) -> None:
        """A retried request returns identical rollouts, even after the engine served another request in between."""
        first = rl_run(engine.generate(rollout_request))
        other = replace(rollout_request, group_id=0, seed=derive_seed("conformance.engine.other", rollout_request.seed))
        rl_run(engine.generate(other))
        again = rl_run(engine.generate(rollout_request))
        assert first == again, f"the same request gave different rollouts: {_describe_difference(first, again)}"

    def test_engine_group_has_n_rollouts_labelled_with_the_request(
        self, engine: RolloutEngine, rollout_request: RolloutRequest, rl_run: Run[Any]
    ) -> None:
        """A group has exactly `n` rollouts, each carrying the request's group id, policy version, seed and prompt."""
        group = rl_run(engine.generate(rollout_request))
        req = rollout_request
        assert len(group) == req.n, f"the engine returned {len(group)} rollouts for n={req.n}"
        for i, r in enumerate(group):
            assert r.group_id == req.group_id, f"rollout {i} has group_id {r.group_id}, the request {req.group_id}"
            assert r.policy_version == req.policy_version, (
                f"rollout {i} has policy_version {r.policy_version}, the request {req.policy_version}"
            )
            assert r.seed == req.seed, f"rollout {i} has seed {r.seed}, the request {req.seed}"
            assert (r.question, r.answer) == (req.prompt.question, req.prompt.answer), (
                f"rollout {i} carries prompt {(r.question, r.answer)!r}, the request {req.prompt!r}"
            )

    def test_engine_logprobs_are_one_finite_nonpositive_value_per_token(
        self, engine: RolloutEngine, rollout_request: RolloutRequest, rl_run: Run[Any]
    ) -> None:
        """Every rollout records one sampling log-probability per token id, each finite and at most 0."""
        for i, r in enumerate(rl_run(engine.generate(rollout_request))):
            assert len(r.logprobs) == len(r.token_ids), (
                f"rollout {i} has {len(r.token_ids)} token ids but {len(r.logprobs)} log-probs"
            )
            for t, lp in enumerate(r.logprobs):
                assert math.isfinite(lp) and lp <= 0.0, (
                    f"rollout {i}, token {t}: log-prob {lp!r} is not finite and <= 0"
                )

    def test_engine_samples_within_a_group_differ(
        self, engine: RolloutEngine, rollout_request: RolloutRequest, capabilities: Capabilities, rl_run: Run[Any]
    ) -> None:
        """The `n` samples of one group are independent draws, not `n` copies of one completion."""
        require(capabilities, "distinct_samples_within_group", "samples of a group differ")
        group = rl_run(engine.generate(rollout_request))
        distinct = {tuple(r.token_ids) for r in group}
        assert len(distinct) > 1, (
            f"all {len(group)} samples of the group are the same completion {group[0].completion!r}"
        )

    def test_engine_different_seeds_give_different_groups(
        self, engine: RolloutEngine, rollout_request: RolloutRequest, capabilities: Capabilities, rl_run: Run[Any]
    ) -> None:
        """Two requests that differ only in their seed sample different groups: the seed reaches the sampler."""
        require(capabilities, "distinct_groups_across_seeds", "different seeds give different groups")
        a = rl_run(engine.generate(rollout_request))
        b = rl_run(
            engine.generate(replace(rollout_request, seed=derive_seed("conformance.reseed", rollout_request.seed)))
        )
        assert [r.token_ids for r in a] != [r.token_ids for r in b], (
            "requests differing only in their seed sampled the same group: the engine ignores the seed"
        )

    def test_engine_serves_the_adapter_each_request_names(
        self, engine: RolloutEngine, rollout_request: RolloutRequest, other_adapter: ArtifactRef, rl_run: Run[Any]
    ) -> None:
        """Each request is sampled from the adapter it names, whatever the engine served before: two requests that
        differ only in their adapter (same policy-version label, same seed) give different groups (other tokens, or
        the same tokens with the other adapter's log-probs), in either order."""
        other = replace(rollout_request, adapter=other_adapter)
        first_other = rl_run(engine.generate(other))
        mine = rl_run(engine.generate(rollout_request))
        # Log-probs too: from one seed, close adapters draw the same tokens (a real model's after 3 steps at lr 3e-4).
        assert first_difference(mine, first_other) is not None, (
            f"a request for adapter {rollout_request.adapter.digest[:12]} returned the same group (token ids and "
            f"log-probs) as the previous request for adapter {other_adapter.digest[:12]} (both labelled policy version "
            f"{rollout_request.policy_version}): the engine served a stale adapter. Key a loaded adapter by its "
            "digest, never by its version label or name"
        )
        again = rl_run(engine.generate(other))
        assert again == first_other, (
            f"the request for adapter {other_adapter.digest[:12]} changed after another adapter was served: "
            f"{_describe_difference(first_other, again)}"
        )
