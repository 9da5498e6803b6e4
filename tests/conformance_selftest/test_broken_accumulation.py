"""The gradient-accumulation law, run the way a fork runs it (`pytest --pyargs rl.conformance.test_suite --rl-impl
...` from a directory without our conftest.py), passes our micro-batched trainer and fails the classic accumulation
bug on the uneven split only, saying why."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
pytest_plugins = ("pytester",)

HERE = Path(__file__).resolve().parent
SUITE_TIMEOUT_S = 600.0


@pytest.fixture
def pytester(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """A pytester directory with a fork's ini, whose subprocess can import `broken_accumulation`."""
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")])))
    return pytester


def run_law(pytester: pytest.Pytester, impl: str) -> pytest.RunResult:
    return pytester.runpytest_subprocess(
        "--pyargs", "rl.conformance.test_suite", "--rl-impl", impl,
        "-k", "accumulated_over_micro_batches", "-p", "no:cacheprovider", "-rfs", "-v",
        timeout=SUITE_TIMEOUT_S,
    )  # fmt: skip


def test_our_micro_batched_trainer_passes_the_accumulation_law(pytester: pytest.Pytester) -> None:
    run_law(pytester, "rl.conformance.bindings.ours:REAL_CPU").assert_outcomes(passed=2)


def test_a_mean_per_micro_batch_fails_the_accumulation_law_on_the_uneven_split_only(pytester: pytest.Pytester) -> None:
    """Micro-batches of 1 are equal, so each micro-batch's mean over the number of micro-batches is the batch mean
    there; 3 + 3 + 2 weighs the last two samples 1/6 against 1/9: the gradient norm moves, the reported loss (the
    unscaled per-sample sum) does not."""
    result = run_law(pytester, "broken_accumulation:MEAN_PER_MICRO_BATCH")
    result.assert_outcomes(passed=1, failed=1)
    out = result.stdout.str()
    assert "whole_batch_step[1] PASSED" in out, out
    assert "micro-batches of 3 (of 8 samples) reported gradient norm" in out, out
