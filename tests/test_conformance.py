"""The conformance suite against our own implementations, and proof that it can fail.

`TestFakes` runs every law on the fakes the way a fork would (by subclassing `LoopContract`); `TestLocalArtifacts`
binds one tier. The rest hands each law a deliberately broken implementation and checks that exactly that law fails,
then runs the packaged suite through the plugin (`--rl-impl`) to check its skips, failures and reproduce line.
"""

from __future__ import annotations

import asyncio
import functools
import math
import subprocess
import sys
from collections.abc import Awaitable, Sequence
from dataclasses import replace
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

import rl.loop.grpo as grpo
from rl.advantages import group_normalized_advantages
from rl.artifacts import LocalArtifacts
from rl.checkpoint.memory_store import MemoryStateStore
from rl.conformance import (
    AdvantageContract,
    ArtifactsContract,
    Capabilities,
    GrpoDriverContract,
    Implementation,
    LoopContract,
    LossContract,
    RolloutEngineContract,
    ScorerContract,
    StateStoreContract,
    TrainerContract,
    load_implementation,
)
from rl.conformance.implementation import ImplementationError
from rl.conformance.ours import FAKES, fake_version0_adapter, trainer_algorithm
from rl.conformance.ours import batch_loss as our_batch_loss
from rl.conformance.scorer import default_scorer_group
from rl.loop.grpo import GrpoConfig, GrpoTiers, run_grpo
from rl.loss import grpo_sample_loss
from rl.memory.artifacts import MemoryArtifacts
from rl.sim.chaos import grpo_random
from rl.sim.grpo_tiers import FakeEngine, FakeScorer, FakeTrainer
from rl.trainer.config import TrainerConfig
from rl.types import ArtifactRef, Prompt, Rollout, RolloutRequest, TrainBatch, TrainResult

pytest_plugins = ("pytester",)

# -- our implementations pass ----------------------------------------------------------------------------------------


class TestFakes(LoopContract):
    """Every law of every tier on the fakes, written the way a fork writes its own: fixtures only."""

    @pytest.fixture
    def artifacts(self):
        return MemoryArtifacts()

    @pytest.fixture
    def state_store(self):
        return MemoryStateStore()

    @pytest.fixture
    def engine(self, artifacts):
        return FakeEngine(artifacts)

    @pytest.fixture
    def scorer(self):
        return FakeScorer()

    @pytest.fixture
    def trainer(self, artifacts):
        return FakeTrainer(artifacts)

    @pytest.fixture
    def another_trainer(self, artifacts):
        return FakeTrainer(artifacts)

    @pytest.fixture
    def advantages(self):
        return group_normalized_advantages

    @pytest.fixture
    def sample_loss(self):
        return grpo_sample_loss


class TestOurBatchLoss(LossContract):
    """`rl.loss.grpo_masked_loss`, the padded `[B, T]` form the trainer runs (as TRL-style trainers do): the loss laws
    under our declaration, through the `batch_loss` fixture."""

    @pytest.fixture
    def batch_loss(self):
        return our_batch_loss


class TestTrainerConfigAlgorithms(AdvantageContract):
    """Our advantages as the trainer calls them under `TrainerConfig(advantage_scale="none")`, checked against the
    declaration `trainer_algorithm` derives from that config (Dr. GRPO: no scale)."""

    @pytest.fixture
    def advantages(self):
        config = TrainerConfig(advantage_scale="none")
        return functools.partial(group_normalized_advantages, scale=config.advantage_scale, eps=config.advantage_eps)

    @pytest.fixture
    def algorithm(self):
        return trainer_algorithm(TrainerConfig(advantage_scale="none"))


class TestLocalArtifacts(ArtifactsContract):
    """One tier on its own: the filesystem artifact store (no torch needed)."""

    @pytest.fixture
    def artifacts(self, tmp_path):
        return LocalArtifacts(tmp_path / "artifacts")


# -- broken implementations fail the law they break ------------------------------------------------------------------


def run(awaitable: Awaitable[Any]) -> Any:
    async def wait() -> Any:
        return await awaitable

    return asyncio.run(wait())


def _request(artifacts: MemoryArtifacts) -> RolloutRequest:
    adapter = run(fake_version0_adapter(artifacts))
    return RolloutRequest(group_id=3, prompt=Prompt("3=", "4"), n=8, adapter=adapter, policy_version=2, seed=11)


class SeedlessEngine(FakeEngine):
    """Samples every request with one fixed seed, but labels its rollouts with the request's seed."""

    async def generate(self, request: RolloutRequest) -> list[Rollout]:
        group = await super().generate(replace(request, seed=1234))
        return [replace(r, seed=request.seed) for r in group]


class ReseedingEngine(FakeEngine):
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


def test_an_engine_that_repeats_one_sample_fails_the_distinct_samples_law():
    artifacts = MemoryArtifacts()
    with pytest.raises(AssertionError, match="samples of the group are the same completion"):
        RolloutEngineContract().test_engine_samples_within_a_group_differ(
            ReseedingEngine(artifacts), _request(artifacts), Capabilities(), run
        )


def test_an_engine_mislabelling_its_policy_version_fails_the_labelling_law():
    class StaleLabels(FakeEngine):
        async def generate(self, request):
            return [replace(r, policy_version=0) for r in await super().generate(request)]

    artifacts = MemoryArtifacts()
    with pytest.raises(AssertionError, match="policy_version 0, the request 2"):
        RolloutEngineContract().test_engine_group_has_n_rollouts_labelled_with_the_request(
            StaleLabels(artifacts), _request(artifacts), run
        )


def test_a_scorer_that_sorts_its_rewards_fails_the_permutation_law():
    class SortingScorer(FakeScorer):
        async def score_group(self, rollouts: Sequence[Rollout]) -> list[float]:
            return sorted(await super().score_group(rollouts))

    contract, group = ScorerContract(), default_scorer_group()
    contract.test_scorer_returns_one_finite_reward_per_rollout(SortingScorer(), group, run)
    with pytest.raises(AssertionError, match="scoring the group in order"):
        contract.test_scorer_permuting_a_group_permutes_its_rewards(
            scorer=SortingScorer(), scorer_group=group, rl_run=run
        )


def test_a_scorer_returning_nan_fails_the_finite_reward_law():
    class NanScorer(FakeScorer):
        async def score_group(self, rollouts):
            return [math.nan for _ in rollouts]

    with pytest.raises(AssertionError, match="not finite"):
        ScorerContract().test_scorer_returns_one_finite_reward_per_rollout(NanScorer(), default_scorer_group(), run)


def _batch(artifacts: MemoryArtifacts, trainer: FakeTrainer) -> TrainBatch:
    init = run(trainer.init_adapter(5))
    engine = FakeEngine(artifacts)
    rollouts = run(engine.generate(RolloutRequest(0, Prompt("3=", "4"), 4, init.adapter, 0, 9)))
    return TrainBatch(0, rollouts, [1.0, 0.0, 0.5, 0.0], init.adapter, init.optimizer_state, new_version=1)


def test_a_trainer_that_is_not_replayable_fails_the_bitwise_replay_law():
    class DriftingTrainer(FakeTrainer):
        """Its learning rate creeps up with every call: a replayed step computes other bits."""

        async def train_step(self, batch: TrainBatch) -> TrainResult:
            self.lr *= 1.01
            return await super().train_step(batch)

    artifacts = MemoryArtifacts()
    trainer = DriftingTrainer(artifacts)
    batch = _batch(artifacts, trainer)
    contract = TrainerContract()
    contract.test_trainer_train_step_returns_version_new_version(trainer, batch, run)
    contract.test_trainer_step_changes_the_adapter(trainer, batch, run)
    with pytest.raises(AssertionError, match="the same batch trained twice gave"):
        contract.test_trainer_replaying_a_batch_is_bitwise_identical(trainer, batch, Capabilities(), run)


def test_a_trainer_whose_init_ignores_its_seed_fails_the_init_law():
    class FixedInit(FakeTrainer):
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


def test_a_state_store_that_keeps_its_first_write_fails_the_last_write_law():
    class WriteOnce(MemoryStateStore):
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


# -- capabilities, required fixtures, the Implementation shape ---------------------------------------------------------


def test_a_missing_capability_skips_its_law_naming_the_flag():
    artifacts = MemoryArtifacts()
    trainer = FakeTrainer(artifacts)
    with pytest.raises(pytest.skip.Exception, match=r"Capabilities\.bitwise_replay is False"):
        TrainerContract().test_trainer_replaying_a_batch_is_bitwise_identical(
            trainer, _batch(artifacts, trainer), Capabilities(bitwise_replay=False), run
        )
    with pytest.raises(pytest.skip.Exception, match=r"Capabilities\.supports_pipelined is False"):
        GrpoDriverContract().test_driver_train_step_inputs_do_not_depend_on_group_finish_order(
            run_grpo, GrpoConfig(), Capabilities(supports_pipelined=False), "pipelined"
        )


def test_load_implementation_accepts_an_implementation_or_any_object_with_factories(monkeypatch):
    assert load_implementation("rl.conformance.ours:FAKES") is FAKES
    module = ModuleType("duck_impl")
    module.IMPLS = SimpleNamespace(duck=SimpleNamespace(scorer=FakeScorer))  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "duck_impl", module)
    duck = load_implementation("duck_impl:IMPLS.duck")
    assert duck.scorer is FakeScorer and duck.engine is None and duck.capabilities == Capabilities()


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("rl.conformance.ours", "must look like"),
        ("no_such_module_here:X", "cannot import"),
        ("rl.conformance.ours:NOPE", "has no attribute"),
        ("rl.conformance.ours:__all__", "none of the factories"),
    ],
)
def test_load_implementation_explains_a_bad_spec(spec, match):
    with pytest.raises(ImplementationError, match=match):
        load_implementation(spec)


def test_an_implementation_rejects_a_non_callable_factory():
    with pytest.raises(ImplementationError, match="`engine` must be callable"):
        Implementation(name="bad", engine=FakeEngine(MemoryArtifacts()))  # type: ignore[arg-type]


def test_the_plugin_and_the_package_import_without_torch_flyte_or_vllm():
    """The plugin loads in every pytest run of an environment: it must stay light and never pull the heavy stacks."""
    code = (
        "import sys, rl.conformance.plugin; "
        "heavy = [m for m in ('torch', 'flyte', 'vllm', 'hypothesis', 'fakes', 'rl.conformance.artifacts', "
        "'rl.conformance.state_store', 'rl.conformance.rollout_engine', 'rl.conformance.scorer', "
        "'rl.conformance.trainer') "
        "if m in sys.modules]; "
        "import rl.conformance.test_suite, rl.conformance.ours; "
        "heavy += [m for m in ('torch', 'flyte', 'vllm') if m in sys.modules]; "
        "print(heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# -- the packaged suite through the plugin ---------------------------------------------------------------------------


@pytest.fixture
def pytester(pytester):
    """A pytester directory with the ini a fork would have (pytest-asyncio's loop scope set, so no warning)."""
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    return pytester


BROKEN_IMPL = """
from dataclasses import replace

from rl.sim.grpo_tiers import FakeEngine, FakeScorer, FakeTrainer
from rl.conformance import Capabilities, Implementation


class SeedlessEngine(FakeEngine):
    async def generate(self, request):
        group = await super().generate(replace(request, seed=1234))
        return [replace(r, seed=request.seed) for r in group]


IMPL = Implementation(
    name="broken", engine=SeedlessEngine, trainer=FakeTrainer, scorer=FakeScorer,
    capabilities=Capabilities(bitwise_replay=False),
)
"""


def test_the_packaged_suite_binds_rl_impl_skips_missing_tiers_and_prints_the_reproduce_line(pytester):
    pytester.makepyfile(broken_impl=BROKEN_IMPL)
    pytester.syspathinsert()
    result = pytester.runpytest(
        "--pyargs",
        "rl.conformance.test_suite",
        "--rl-impl",
        "broken_impl:IMPL",
        "--rl-seed",
        "3",
        "-rfs",
        "-m",
        "not rl_driver",
    )
    outcomes = result.parseoutcomes()
    # An engine deaf to the seed also fails the frequency law: its 64 seeded groups of draws are one group 64 times.
    assert outcomes.get("failed") == 2, result.stdout.str()
    result.stdout.fnmatch_lines(
        [
            "rl-conformance: seed=3 impl=broken_impl:IMPL",
            "pytest --pyargs rl.conformance.test_suite::TestRolloutEngine::"
            "test_engine_different_seeds_give_different_groups --rl-impl broken_impl:IMPL --rl-seed 3",
            "FAILED*TestRolloutEngine::test_engine_different_seeds_give_different_groups*",
        ]
    )
    result.stdout.fnmatch_lines(["FAILED*TestRolloutEngine::test_engine_recorded_logprobs_are_those_of_the_distri*"])
    out = result.stdout.str()
    assert "broken provides no `artifacts` factory, so the Artifacts laws do not apply" in out
    assert "broken provides no `state_store` factory, so the StateStore laws do not apply" in out
    assert "Capabilities.bitwise_replay is False" in out


def test_a_contract_without_its_fixtures_says_what_to_return(pytester):
    pytester.makepyfile(
        """
        from rl.conformance import RolloutEngineContract

        class TestUnbound(RolloutEngineContract):
            pass
        """
    )
    result = pytester.runpytest("-k", "same_request")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*NotImplementedError: RolloutEngineContract needs the `*` fixture*"])


def test_the_packaged_suite_without_rl_impl_fails_loudly(pytester):
    result = pytester.runpytest("--pyargs", "rl.conformance.test_suite", "-k", "TestScorer")
    assert result.ret != 0
    result.stdout.fnmatch_lines(["*test_suite checks the implementation named by --rl-impl*"])


def test_the_readme_documents_the_fork_commands():
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    assert "pytest --pyargs rl.conformance.test_suite --rl-impl" in readme


def test_rl_conformance_exports_exactly_its_type_checking_imports_and_loads_them_lazily():
    """`rl.conformance.__all__` is exactly the names its `TYPE_CHECKING` block imports and its `_HOMES` table loads,
    each resolves to the object of that name in the module both name, importing the package loads none of those
    modules, and any other name is an AttributeError."""
    import ast
    import importlib

    import rl.conformance as conformance

    tree = ast.parse(Path(conformance.__file__).read_text(encoding="utf-8"))
    block = next(n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING")
    imported = {(a.name, n.module) for n in block.body if isinstance(n, ast.ImportFrom) for a in n.names}
    assert sorted(name for name, _ in imported) == sorted(conformance.__all__)
    assert len(set(conformance.__all__)) == len(conformance.__all__)
    assert imported == {(name, f"rl.conformance.{home}") for name, home in conformance._HOMES.items()}
    for name, module in imported:
        assert getattr(conformance, name) is getattr(importlib.import_module(module), name)
    with pytest.raises(AttributeError, match="has no attribute 'NotAContract'"):
        _ = conformance.NotAContract
    homes = sorted({f"rl.conformance.{home}" for home in conformance._HOMES.values()})
    code = f"import sys, rl.conformance; print([m for m in {homes!r} if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
