"""Binding an implementation to the suite: a missing capability skips its law, `load_implementation` and
`Implementation` accept the shapes they document and explain the rest, and the plugin stays light to import."""

from __future__ import annotations

import subprocess
import sys
from types import ModuleType, SimpleNamespace

import pytest
from conformance_support import run, train_batch

from rl.conformance import (
    Capabilities,
    GrpoDriverContract,
    Implementation,
    LawSizes,
    RolloutEngineContract,
    TrainerContract,
    load_implementation,
)
from rl.conformance.bindings.ours import IN_MEMORY, memory_version0_adapter
from rl.deploy.simulated.artifacts import MemoryArtifacts
from rl.deploy.simulated.grpo_tiers import MemoryEngine, MemoryScorer, MemoryTrainer
from rl.errors import ImplementationError
from rl.loop.grpo import GrpoConfig, run_grpo
from rl.types import Prompt, Rollout, RolloutRequest


def test_a_missing_capability_skips_its_law_naming_the_flag():
    artifacts = MemoryArtifacts()
    trainer = MemoryTrainer(artifacts)
    with pytest.raises(pytest.skip.Exception, match=r"Capabilities\.bitwise_replay is False"):
        TrainerContract().test_trainer_replaying_a_batch_is_bitwise_identical(
            trainer, train_batch(artifacts, trainer), Capabilities(bitwise_replay=False), run
        )
    with pytest.raises(pytest.skip.Exception, match=r"Capabilities\.supports_pipelined is False"):
        GrpoDriverContract().test_driver_train_step_inputs_do_not_depend_on_group_finish_order(
            run_grpo, GrpoConfig(), Capabilities(supports_pipelined=False), "pipelined"
        )


def test_load_implementation_accepts_an_implementation_or_any_object_with_factories(monkeypatch):
    assert load_implementation("rl.conformance.bindings.ours:IN_MEMORY") is IN_MEMORY
    module = ModuleType("duck_impl")
    module.IMPLS = SimpleNamespace(duck=SimpleNamespace(scorer=MemoryScorer))  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "duck_impl", module)
    duck = load_implementation("duck_impl:IMPLS.duck")
    assert duck.scorer is MemoryScorer and duck.engine is None and duck.capabilities == Capabilities()


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("rl.conformance.bindings.ours", "must look like"),
        ("no_such_module_here:X", "cannot import"),
        ("rl.conformance.bindings.ours:NOPE", "has no attribute"),
        ("rl.conformance.bindings.ours:__all__", "none of the factories"),
    ],
)
def test_load_implementation_explains_a_bad_spec(spec, match):
    with pytest.raises(ImplementationError, match=match):
        load_implementation(spec)


def test_an_implementation_rejects_a_non_callable_factory():
    with pytest.raises(ImplementationError, match="`engine` must be callable"):
        Implementation(name="bad", engine=MemoryEngine(MemoryArtifacts()))  # type: ignore[arg-type]


def test_declared_law_sizes_draw_that_share_of_a_laws_groups_rounded_up_and_at_least_one():
    eighth = LawSizes(draw_fraction=1 / 8)
    assert [eighth.groups(n) for n in (64, 8, 3, 1)] == [8, 1, 1, 1]
    assert LawSizes(draw_fraction=0.28).groups(25) == 7  # 25 * 0.28 is 7.000000000000001 in floats
    assert LawSizes().groups(64) == 64
    assert (LawSizes().declared(), eighth.declared()) == ("", "draw_fraction=0.125")


@pytest.mark.parametrize(("fraction", "error"), [(0.0, ValueError), (1.5, ValueError), ("1/8", TypeError)])
def test_law_sizes_refuse_a_fraction_outside_0_to_1(fraction, error):
    with pytest.raises(error, match="draw_fraction must be"):
        LawSizes(draw_fraction=fraction)


def test_an_implementation_refuses_sizes_that_are_not_law_sizes_and_a_duck_keeps_its_own(monkeypatch):
    with pytest.raises(ImplementationError, match=r"`sizes` must be a rl\.conformance\.LawSizes, got float"):
        Implementation(name="bad", sizes=0.125)  # type: ignore[arg-type]
    module = ModuleType("duck_sized")
    module.IMPL = SimpleNamespace(scorer=MemoryScorer, sizes=LawSizes(draw_fraction=0.5))  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "duck_sized", module)
    assert load_implementation("duck_sized:IMPL").sizes == LawSizes(draw_fraction=0.5)


class CountingEngine(MemoryEngine):
    """The in-memory engine, counting the groups it is asked for."""

    requests = 0

    async def generate(self, request: RolloutRequest) -> list[Rollout]:
        self.requests += 1
        return await super().generate(request)


@pytest.mark.parametrize(
    ("law", "requests_full", "requests_at_an_eighth"),
    [
        ("test_engine_recorded_logprobs_are_those_of_the_distribution_it_samples", 64, 8),
        ("test_engine_completion_ends_at_its_first_end_of_sequence_token", 8, 1),
        ("test_engine_groups_seeded_apart_share_no_samples", 3 * 2, 1 * 2),  # pairs of groups
    ],
)
def test_the_sampling_laws_draw_the_declared_share_of_their_groups(law, requests_full, requests_at_an_eighth):
    contract = RolloutEngineContract()
    counts = []
    for sizes in (LawSizes(), LawSizes(draw_fraction=1 / 8)):
        artifacts = MemoryArtifacts()
        engine = CountingEngine(artifacts)
        request = RolloutRequest(3, Prompt("3=", "4"), 8, run(memory_version0_adapter(artifacts)), 2, seed=11)
        eos = {"eos_token_id": None} if "end_of_sequence" in law else {}  # the in-memory engine has none
        getattr(contract, law)(engine=engine, rollout_request=request, law_sizes=sizes, rl_run=run, **eos)
        counts.append(engine.requests)
    assert counts == [requests_full, requests_at_an_eighth]


def test_the_plugin_and_the_package_import_without_torch_flyte_or_vllm():
    """The plugin loads in every pytest run of an environment: it must stay light and never pull the heavy stacks."""
    code = (
        "import sys, rl.conformance.plugin; "
        "heavy = [m for m in ('torch', 'flyte', 'vllm', 'hypothesis', 'fakes', 'rl.conformance.artifacts_contract', "
        "'rl.conformance.state_store_contract', 'rl.conformance.rollout_engine_contract', "
        "'rl.conformance.scorer_contract', "
        "'rl.conformance.trainer_contract') "
        "if m in sys.modules]; "
        "import rl.conformance.test_suite, rl.conformance.bindings.ours; "
        "heavy += [m for m in ('torch', 'flyte', 'vllm') if m in sys.modules]; "
        "print(heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
