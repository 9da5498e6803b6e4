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
    TrainerContract,
    load_implementation,
)
from rl.conformance.implementation import ImplementationError
from rl.conformance.ours import FAKES
from rl.loop.grpo import GrpoConfig, run_grpo
from rl.memory.artifacts import MemoryArtifacts
from rl.sim.grpo_tiers import FakeEngine, FakeScorer, FakeTrainer


def test_a_missing_capability_skips_its_law_naming_the_flag():
    artifacts = MemoryArtifacts()
    trainer = FakeTrainer(artifacts)
    with pytest.raises(pytest.skip.Exception, match=r"Capabilities\.bitwise_replay is False"):
        TrainerContract().test_trainer_replaying_a_batch_is_bitwise_identical(
            trainer, train_batch(artifacts, trainer), Capabilities(bitwise_replay=False), run
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
