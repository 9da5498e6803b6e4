"""The conformance suite can fail: each law, handed a deliberately broken implementation, fails, and only that law."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

import pytest
from conformance_support import run, train_batch

import rl.loop.grpo as grpo
from rl.conformance import (
    ArtifactsContract,
    Capabilities,
    GrpoDriverContract,
    RolloutEngineContract,
    ScorerContract,
    StateStoreContract,
    TrainerContract,
)
from rl.conformance.bindings.ours import memory_version0_adapter
from rl.conformance.scorer_contract import default_scorer_group
from rl.deploy.simulated.artifacts import MemoryArtifacts
from rl.deploy.simulated.chaos import grpo_random
from rl.deploy.simulated.grpo_tiers import MemoryEngine, MemoryScorer, MemoryTrainer, decode_table, encode_table
from rl.loop.grpo import GrpoConfig, GrpoTiers, run_grpo
from rl.storage.checkpoint.memory_store import MemoryCheckpointStore
from rl.types import ArtifactRef, Prompt, Rollout, RolloutRequest, TrainBatch, TrainResult


def _request(artifacts: MemoryArtifacts) -> RolloutRequest:
    adapter = run(memory_version0_adapter(artifacts))
    return RolloutRequest(group_id=3, prompt=Prompt("3=", "4"), n=8, adapter=adapter, policy_version=2, seed=11)


class SeedlessEngine(MemoryEngine):
    """Samples every request with one fixed seed, but labels its rollouts with the request's seed."""

    async def generate(self, request: RolloutRequest) -> list[Rollout]:
        group = await super().generate(replace(request, seed=1234))
        return [replace(r, seed=request.seed) for r in group]


class ReseedingEngine(MemoryEngine):
    """Restarts its generator for every sample: all `n` samples of a group are the same completion."""

    async def generate(self, request: RolloutRequest) -> list[Rollout]:
        first = (await super().generate(replace(request, n=1)))[0]
        return [first] * request.n


def test_an_engine_that_ignores_the_seed_fails_exactly_the_seed_law():
    """The engine still labels and repeats its groups correctly; only the different-seeds law catches it."""
    artifacts = MemoryArtifacts()
    engine, request, contract = SeedlessEngine(artifacts), _request(artifacts), RolloutEngineContract()
    caps = Capabilities()
    contract.test_engine_same_request_gives_same_rollouts(engine, request, run)
    contract.test_engine_group_has_n_rollouts_labelled_with_the_request(engine, request, run)
    contract.test_engine_logprobs_are_one_finite_nonpositive_value_per_token(engine, request, run)
    contract.test_engine_samples_within_a_group_differ(engine, request, caps, run)
    with pytest.raises(AssertionError, match="ignores the seed"):
        contract.test_engine_different_seeds_give_different_groups(engine, request, caps, run)


class FirstAdapterEngine(MemoryEngine):
    """Serves the first adapter it was asked for to every request (a cache keyed by anything but the digest)."""

    async def generate(self, request: RolloutRequest) -> list[Rollout]:
        self.first = getattr(self, "first", request.adapter)
        return await super().generate(replace(request, adapter=self.first))


def test_the_adapter_law_tells_close_adapters_apart_by_their_log_probs_when_their_draws_coincide():
    """Two adapters 0.02 nats apart draw the same digits from one seed (one stream of uniforms, slightly moved
    boundaries), as SmolLM2's version 0 and its adapter three steps on drew the same 32 tokens: the law passes an
    engine that serves each (it failed it when it compared token ids only) and fails one that serves the first."""
    artifacts = MemoryArtifacts()
    request = _request(artifacts)
    table = decode_table(run(artifacts.get(request.adapter)))["table"]
    nudged = [[x + 0.02 * (d % 2) for d, x in enumerate(row)] for row in table]  # odd digits 0.02 more likely
    close = run(artifacts.put(encode_table(nudged, lineage=[]), name="adapter-close"))
    first, second = (
        run(MemoryEngine(artifacts).generate(replace(request, adapter=a))) for a in (request.adapter, close)
    )
    assert [r.token_ids for r in first] == [r.token_ids for r in second]  # the case: the same draws ...
    assert [r.logprobs for r in first] != [r.logprobs for r in second]  # ... from two distributions
    contract = RolloutEngineContract()
    contract.test_engine_serves_the_adapter_each_request_names(MemoryEngine(artifacts), request, close, run)
    with pytest.raises(AssertionError, match="the engine served a stale adapter"):
        contract.test_engine_serves_the_adapter_each_request_names(FirstAdapterEngine(artifacts), request, close, run)


def test_an_engine_that_repeats_one_sample_fails_the_distinct_samples_law():
    artifacts = MemoryArtifacts()
    with pytest.raises(AssertionError, match="samples of the group are the same completion"):
        RolloutEngineContract().test_engine_samples_within_a_group_differ(
            ReseedingEngine(artifacts), _request(artifacts), Capabilities(), run
        )


def test_an_engine_mislabelling_its_policy_version_fails_the_labelling_law():
    class StaleLabels(MemoryEngine):
        async def generate(self, request):
            return [replace(r, policy_version=0) for r in await super().generate(request)]

    artifacts = MemoryArtifacts()
    with pytest.raises(AssertionError, match="policy_version 0, the request 2"):
        RolloutEngineContract().test_engine_group_has_n_rollouts_labelled_with_the_request(
            StaleLabels(artifacts), _request(artifacts), run
        )


def test_a_scorer_that_sorts_its_rewards_fails_the_permutation_law():
    class SortingScorer(MemoryScorer):
        async def score_group(self, rollouts: Sequence[Rollout]) -> list[float]:
            return sorted(await super().score_group(rollouts))

    contract, group = ScorerContract(), default_scorer_group()
    contract.test_scorer_returns_one_finite_reward_per_rollout(SortingScorer(), group, run)
    with pytest.raises(AssertionError, match="scoring the group in order"):
        contract.test_scorer_permuting_a_group_permutes_its_rewards(
            scorer=SortingScorer(), scorer_group=group, rl_run=run
        )


def test_a_scorer_returning_nan_fails_the_finite_reward_law():
    class NanScorer(MemoryScorer):
        async def score_group(self, rollouts):
            return [math.nan for _ in rollouts]

    with pytest.raises(AssertionError, match="not finite"):
        ScorerContract().test_scorer_returns_one_finite_reward_per_rollout(NanScorer(), default_scorer_group(), run)


def test_a_trainer_that_is_not_replayable_fails_the_bitwise_replay_law():
    class DriftingTrainer(MemoryTrainer):
        """Its learning rate creeps up with every call: a replayed step computes other bits."""

        async def train_step(self, batch: TrainBatch) -> TrainResult:
            self.lr *= 1.01
            return await super().train_step(batch)

    artifacts = MemoryArtifacts()
    trainer = DriftingTrainer(artifacts)
    batch = train_batch(artifacts, trainer)
    contract = TrainerContract()
    contract.test_trainer_train_step_returns_version_new_version(trainer, batch, run)
    contract.test_trainer_step_changes_the_adapter(trainer, batch, run)
    with pytest.raises(AssertionError, match="the same batch trained twice gave"):
        contract.test_trainer_replaying_a_batch_is_bitwise_identical(trainer, batch, Capabilities(), run)


def test_a_trainer_whose_init_ignores_its_seed_fails_the_init_law():
    class FixedInit(MemoryTrainer):
        async def init_adapter(self, seed: int) -> TrainResult:
            return await super().init_adapter(0)

    with pytest.raises(AssertionError, match="same adapter for two different seeds"):
        TrainerContract().test_trainer_init_adapter_is_deterministic_in_its_seed(FixedInit(MemoryArtifacts()), 0, run)


def test_artifacts_that_alias_their_storage_fail_the_private_copy_law():
    class AliasingArtifacts(MemoryArtifacts):
        async def get(self, ref: ArtifactRef) -> dict[str, bytes]:
            return self._blobs[ref.digest]  # the stored dict itself

    with pytest.raises(AssertionError, match="leaked into the stored artifact"):
        ArtifactsContract().test_artifacts_get_returns_a_private_copy(AliasingArtifacts(), run)


def test_artifacts_returning_none_for_a_missing_ref_fail_the_missing_law():
    class Lenient(MemoryArtifacts):
        async def get(self, ref):
            return self._blobs.get(ref.digest, {})

    with pytest.raises(pytest.fail.Exception, match="DID NOT RAISE"):
        ArtifactsContract().test_artifacts_get_of_a_missing_ref_raises(Lenient(), run)


def test_a_checkpoint_store_that_keeps_its_first_write_fails_the_last_write_law():
    class WriteOnce(MemoryCheckpointStore):
        async def save(self, data: bytes) -> None:
            if self.data is None:
                await super().save(data)

    with pytest.raises(AssertionError, match="last saved blob"):
        StateStoreContract().test_state_store_last_write_wins(WriteOnce(), run)


async def _nan_to_zero_driver(config: GrpoConfig, tiers: GrpoTiers, store) -> grpo.GrpoOutcome:
    """Our driver, behind a scorer wrapper that quietly turns a non-finite reward into 0."""

    class Sanitising:
        async def score_group(self, rollouts):
            return [r if math.isfinite(r) else 0.0 for r in await tiers.scorer.score_group(rollouts)]

    return await run_grpo(config, replace(tiers, scorer=Sanitising()), store)


def test_a_driver_that_swallows_nan_rewards_fails_the_nan_law():
    config = GrpoConfig(iterations=3, prompts_per_iteration=2, group_size=3, seed=0)
    with pytest.raises(pytest.fail.Exception, match="DID NOT RAISE"):
        GrpoDriverContract().test_driver_nan_reward_raises_naming_group_and_sample(_nan_to_zero_driver, config, run)


def test_the_contracts_fault_scenarios_really_kill_drivers():
    """The random-fault law is not vacuous: on its small run shape the plans crash drivers and fail tasks."""
    config = GrpoConfig(iterations=3, prompts_per_iteration=2, group_size=3, seed=0)
    for pipelined in (False, True):
        reports = [grpo_random(pipelined, config=config)(s) for s in range(6)]
        assert sum(r.crashes for r in reports) > 0
