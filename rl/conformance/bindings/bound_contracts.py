"""The tier, driver and storage contracts bound to the implementation `--rl-impl` names, with the session fixture
`implementation` they all read; `rl.conformance.test_suite` imports them, so `--pyargs` collects them there.

A tier the implementation does not provide (its factory is None) skips, and the skip says which factory is missing.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import pytest

from rl.conformance.agentic_contract import AgenticContract
from rl.conformance.algorithm_spec import AlgorithmSpec
from rl.conformance.artifacts_contract import ArtifactsContract
from rl.conformance.batch_reward_scorer_contract import BatchReward, BatchRewardScorerContract
from rl.conformance.capabilities import Capabilities
from rl.conformance.driver_replay_contract import DriverReplayContract
from rl.conformance.generation_batch_contract import AccumulatedLossFn, GenerationBatchContract
from rl.conformance.grpo_driver_contract import GrpoDriverContract
from rl.conformance.implementation import Implementation, load_implementation
from rl.conformance.law_sizes import LawSizes
from rl.conformance.rollout_buffer_contract import BufferFactory, RolloutBufferContract
from rl.conformance.rollout_buffer_reads_contract import PlantRows, RolloutBufferReadsContract
from rl.conformance.rollout_engine_contract import RolloutEngineContract
from rl.conformance.scorer_contract import ScorerContract
from rl.conformance.scoring_utilities_contract import ScoringUtilitiesContract
from rl.conformance.state_store_contract import StateStoreContract
from rl.conformance.support.contract_base import Run
from rl.conformance.token_logprob_contract import TokenLogprobContract
from rl.conformance.trainer_contract import TrainerContract, trained_adapter
from rl.conformance.volume_store_contract import StoreFactory, VolumeStoreContract
from rl.deploy.simulated.agentic_sim import bandit_trainer, traced_judge_tier
from rl.deploy.simulated.artifacts import MemoryArtifacts
from rl.errors import ImplementationError
from rl.loop.agentic import run_agentic
from rl.loop.grpo import GrpoDriver, run_grpo
from rl.protocols import Artifacts, CheckpointStore, RolloutEngine, Scorer, Trainer
from rl.storage.checkpoint.format import as_altered, as_another_schema_version
from rl.types import ArtifactRef


@pytest.fixture(scope="session")
def implementation(request: pytest.FixtureRequest) -> Implementation:
    """The `Implementation` named by `--rl-impl`."""
    spec = request.config.getoption("rl_impl", default=None)
    if not spec:
        pytest.fail(
            "rl.conformance.test_suite checks the implementation named by --rl-impl; pass "
            "--rl-impl package.module:ATTRIBUTE naming an rl.conformance.Implementation",
            pytrace=False,
        )
    try:
        return load_implementation(spec)
    except ImplementationError as exc:
        pytest.fail(str(exc), pytrace=False)


AGENTIC_PARTS = ("agentic_driver", "judge_tier", "policy_trainer")


def _factory(implementation: Implementation, name: str, laws: str) -> Any:
    factory = getattr(implementation, name)
    if factory is None:
        pytest.skip(f"{implementation.name} provides no `{name}` factory, so the {laws} laws do not apply")
    return factory


class _Bound:
    """Fixtures every bound contract shares: the implementation's capabilities and its (or an in-memory) store."""

    @pytest.fixture
    def capabilities(self, implementation: Implementation) -> Capabilities:
        return implementation.capabilities

    @pytest.fixture
    def artifacts(self, implementation: Implementation) -> Artifacts:
        factory = implementation.artifacts
        return factory() if factory is not None else MemoryArtifacts()


class TestArtifacts(_Bound, ArtifactsContract):
    @pytest.fixture
    def artifacts(self, implementation: Implementation) -> Artifacts:
        return _factory(implementation, "artifacts", "Artifacts")()


class TestStateStore(_Bound, StateStoreContract):
    @pytest.fixture
    def state_store(self, implementation: Implementation) -> CheckpointStore:
        return _factory(implementation, "state_store", "CheckpointStore")()


class TestRolloutEngine(_Bound, RolloutEngineContract):
    @pytest.fixture
    def engine(self, implementation: Implementation, artifacts: Artifacts) -> RolloutEngine:
        return _factory(implementation, "engine", "RolloutEngine")(artifacts)

    @pytest.fixture
    def law_sizes(self, implementation: Implementation) -> LawSizes:
        return implementation.sizes

    @pytest.fixture
    def algorithm(self, implementation: Implementation) -> AlgorithmSpec:
        return implementation.algorithm

    @pytest.fixture
    def adapter(self, implementation: Implementation, artifacts: Artifacts, rl_run: Run[Any]) -> ArtifactRef:
        if implementation.adapter is not None:
            made = implementation.adapter(artifacts)
            return rl_run(made) if inspect.isawaitable(made) else made
        if implementation.trainer is not None:
            return rl_run(implementation.trainer(artifacts).init_adapter(0)).adapter
        pytest.skip(
            f"{implementation.name} provides neither an `adapter` nor a `trainer` factory, so the RolloutEngine laws "
            "have no adapter to sample from"
        )

    @pytest.fixture
    def other_adapter(
        self,
        implementation: Implementation,
        artifacts: Artifacts,
        engine: RolloutEngine,
        rl_seed: int,
        rl_run: Run[Any],
    ) -> ArtifactRef:
        if implementation.trainer is None:
            pytest.skip(
                f"{implementation.name} provides no `trainer` factory, so there is no second adapter to check that "
                "the engine serves the adapter each request names"
            )
        return trained_adapter(engine, implementation.trainer(artifacts), rl_seed, rl_run)

    @pytest.fixture
    def cold_engine(self, implementation: Implementation, artifacts: Artifacts) -> RolloutEngine:
        return _factory(implementation, "engine", "RolloutEngine")(artifacts)


class TestScorer(_Bound, ScorerContract):
    @pytest.fixture
    def scorer(self, implementation: Implementation) -> Scorer:
        return _factory(implementation, "scorer", "Scorer")()


class TestScoringUtilities(_Bound, ScoringUtilitiesContract):
    @pytest.fixture
    def extract_answer(self, implementation: Implementation) -> Callable[[str], str | None]:
        return _factory(implementation, "extract_answer", "answer-extraction")

    @pytest.fixture
    def pass_at_k(self, implementation: Implementation) -> Callable[[int, int, int], float]:
        return _factory(implementation, "pass_at_k", "pass@k")


class TestTrainer(_Bound, TrainerContract):
    @pytest.fixture
    def trainer(self, implementation: Implementation, artifacts: Artifacts) -> Trainer:
        return _factory(implementation, "trainer", "Trainer")(artifacts)

    @pytest.fixture
    def another_trainer(self, implementation: Implementation, artifacts: Artifacts) -> Trainer:
        return _factory(implementation, "trainer", "Trainer")(artifacts)

    @pytest.fixture
    def algorithm(self, implementation: Implementation) -> AlgorithmSpec:
        return implementation.algorithm

    @pytest.fixture
    def distributed_trainer(self, implementation: Implementation) -> Callable[[Artifacts, int], Trainer]:
        return _factory(implementation, "distributed_trainer", "data-parallel train step")

    @pytest.fixture
    def micro_batched_trainer(self, implementation: Implementation) -> Callable[[Artifacts, int], Trainer]:
        return _factory(implementation, "micro_batched_trainer", "micro-batched train step")

    @pytest.fixture
    def engine(self, implementation: Implementation, artifacts: Artifacts) -> RolloutEngine:
        if implementation.engine is None:
            pytest.skip(
                f"{implementation.name} provides no `engine` factory, and the Trainer laws sample their training "
                "batches with the implementation's engine"
            )
        return implementation.engine(artifacts)


class TestGrpoDriver(_Bound, GrpoDriverContract):
    @pytest.fixture
    def driver(self, implementation: Implementation) -> GrpoDriver:
        return _factory(implementation, "driver", "GRPO driver")

    @pytest.fixture
    def checkpoint_from_another_version(self, implementation: Implementation) -> Callable[[bytes], bytes]:
        if implementation.checkpoint_from_another_version is None and implementation.driver is run_grpo:
            return as_another_schema_version
        return _factory(implementation, "checkpoint_from_another_version", "checkpoint schema-version")

    @pytest.fixture
    def checkpoint_altered(self, implementation: Implementation) -> Callable[[bytes], bytes]:
        if implementation.checkpoint_altered is None and implementation.driver is run_grpo:
            return as_altered
        return _factory(implementation, "checkpoint_altered", "altered-checkpoint")


class TestDriverReplay(_Bound, DriverReplayContract):
    @pytest.fixture
    def driver(self, implementation: Implementation) -> GrpoDriver:
        return _factory(implementation, "driver", "replay-compatibility")


class TestAgentic(_Bound, AgenticContract):
    """The agentic laws, with each part the implementation provides; a part it leaves None is ours."""

    @pytest.fixture(autouse=True)
    def _provides_an_agentic_part(self, implementation: Implementation) -> None:
        if all(getattr(implementation, p) is None for p in AGENTIC_PARTS):
            pytest.skip(
                f"{implementation.name} provides none of {', '.join(AGENTIC_PARTS)}, so the agentic laws do not apply"
            )

    @pytest.fixture
    def agentic_driver(self, implementation: Implementation) -> Any:
        return implementation.agentic_driver or run_agentic

    @pytest.fixture
    def judge_tier(self, implementation: Implementation) -> Any:
        return implementation.judge_tier or traced_judge_tier

    @pytest.fixture
    def policy_trainer(self, implementation: Implementation) -> Any:
        return implementation.policy_trainer or bandit_trainer


class TestVolumeStore(_Bound, VolumeStoreContract):
    @pytest.fixture
    def volume_store_factory(self, implementation: Implementation) -> StoreFactory:
        return _factory(implementation, "volume_store", "volume")


class TestRolloutBuffer(_Bound, RolloutBufferContract):
    @pytest.fixture
    def rollout_buffer_factory(self, implementation: Implementation) -> BufferFactory:
        return _factory(implementation, "rollout_buffer", "rollout buffer")


class TestTokenLogprobs(_Bound, TokenLogprobContract):
    @pytest.fixture
    def token_logprobs(self, implementation: Implementation) -> Any:
        return _factory(implementation, "token_logprobs", "trainer log-prob")

    @pytest.fixture
    def algorithm(self, implementation: Implementation) -> AlgorithmSpec:
        return implementation.algorithm


class TestGenerationBatch(_Bound, GenerationBatchContract):
    @pytest.fixture
    def accumulated_loss(self, implementation: Implementation) -> AccumulatedLossFn:
        return _factory(implementation, "accumulated_loss", "generation-batch normaliser")

    @pytest.fixture
    def algorithm(self, implementation: Implementation) -> AlgorithmSpec:
        return implementation.algorithm


class TestBatchRewardScorer(_Bound, BatchRewardScorerContract):
    @pytest.fixture
    def batch_reward_scorer(self, implementation: Implementation) -> Callable[[BatchReward], Scorer]:
        return _factory(implementation, "batch_reward_scorer", "batch-reward Scorer")


class TestRolloutBufferReads(_Bound, RolloutBufferReadsContract):
    @pytest.fixture
    def rollout_buffer_factory(self, implementation: Implementation) -> BufferFactory:
        return _factory(implementation, "rollout_buffer", "rollout buffer")

    @pytest.fixture
    def plant_rollout_rows(self, implementation: Implementation) -> PlantRows:
        return _factory(implementation, "plant_rollout_rows", "rollout buffer read")
