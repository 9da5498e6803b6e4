"""The packaged suite through the pytest plugin (`--rl-impl`): its skips, failures and reproduce line, the fixtures a
bare contract asks for, and the public names `rl.conformance` exports."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest_plugins = ("pytester",)


@pytest.fixture
def pytester(pytester):
    """A pytester directory with the ini a fork would have (pytest-asyncio's loop scope set, so no warning)."""
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    return pytester


BROKEN_IMPL = """
from dataclasses import replace

from rl.deploy.simulated.grpo_tiers import MemoryEngine, MemoryScorer, MemoryTrainer
from rl.conformance import Capabilities, Implementation


class SeedlessEngine(MemoryEngine):
    async def generate(self, request):
        group = await super().generate(replace(request, seed=1234))
        return [replace(r, seed=request.seed) for r in group]


IMPL = Implementation(
    name="broken", engine=SeedlessEngine, trainer=MemoryTrainer, scorer=MemoryScorer,
    capabilities=Capabilities(bitwise_replay=False, trainer_kl_penalty=False),
)
"""


@pytest.mark.heavy  # the whole packaged suite in process, ~1.5 CPU-s
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
    # An engine deaf to the seed also fails the frequency law (its 64 seeded groups of draws are one group 64 times),
    # the truncated-sampling law in its three cuts (the same draws, chi-square) and the adjacent-seeds law (groups
    # seeded s and s + 1 are the same group).
    assert outcomes.get("failed") == 6, result.stdout.str()
    result.stdout.fnmatch_lines(
        [
            "rl-conformance: seed=3 impl=broken_impl:IMPL",
            "pytest --pyargs rl.conformance.test_suite::TestRolloutEngine::"
            "test_engine_different_seeds_give_different_groups --rl-impl broken_impl:IMPL --rl-seed 3",
            "FAILED*TestRolloutEngine::test_engine_different_seeds_give_different_groups*",
        ]
    )
    result.stdout.fnmatch_lines(["FAILED*TestRolloutEngine::test_engine_recorded_logprobs_are_those_of_the_distri*"])
    result.stdout.fnmatch_lines(["FAILED*TestRolloutEngine::test_engine_groups_seeded_apart_share_no_samples*"])
    out = result.stdout.str()
    assert "broken provides no `artifacts` factory, so the Artifacts laws do not apply" in out
    assert "broken provides no `state_store` factory, so the CheckpointStore laws do not apply" in out
    assert "Capabilities.bitwise_replay is False" in out


def test_the_header_says_when_the_implementation_declares_smaller_sampling_laws(pytester):
    """A record made at a `draw_fraction` below 1 says so in its header line; at the full size nothing is added."""
    pytester.makepyfile(
        sized_impl="""
from rl.conformance import Implementation, LawSizes
from rl.deploy.simulated.grpo_tiers import MemoryEngine, MemoryTrainer

IMPL = Implementation(name="sized", engine=MemoryEngine, trainer=MemoryTrainer, sizes=LawSizes(draw_fraction=0.25))
FULL = Implementation(name="full", engine=MemoryEngine, trainer=MemoryTrainer)
"""
    )
    pytester.syspathinsert()
    args = ("--pyargs", "rl.conformance.test_suite", "-m", "rl_engine", "--collect-only", "-q")
    sized = pytester.runpytest(*args, "--rl-impl", "sized_impl:IMPL")
    sized.stdout.fnmatch_lines(
        ["rl-conformance: seed=0 impl=sized_impl:IMPL draw_fraction=0.25 (*share of their groups)"]
    )
    full = pytester.runpytest(*args, "--rl-impl", "sized_impl:FULL")
    full.stdout.fnmatch_lines(["rl-conformance: seed=0 impl=sized_impl:FULL"])
    assert "draw_fraction" not in full.stdout.str()


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
