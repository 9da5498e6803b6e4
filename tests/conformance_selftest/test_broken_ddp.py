"""The DDP shard-step law, run the way a fork runs it (`pytest --pyargs rl.conformance.test_suite --rl-impl ...` from a
directory without our conftest.py), passes the tutorial's step and fails each broken step in `broken_ddp` on the case it
breaks, saying why.

Each run spawns 2 gloo ranks; a deadlocking step costs the law's 20 s collective timeout. The suite runs in a
subprocess, so the spawned ranks and gloo's state never share a process with this session.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
pytest_plugins = ("pytester",)

HERE = Path(__file__).resolve().parent
LAW = "TestDdpShardStep::test_ddp_shard_step_syncs_once_on_every_rank_and_gives_the_full_batch_gradient"
SUITE_TIMEOUT_S = 300.0
"""Generous: several times a run, deadlocked or not (docs/benchmarks.md); the law itself fails a deadlock within its
collective timeout."""


@pytest.fixture
def pytester(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """A pytester directory with a fork's ini, whose subprocess (and its spawned ranks) can import `broken_ddp`."""
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")])))
    return pytester


def run_ddp_law(pytester: pytest.Pytester, impl: str) -> pytest.RunResult:
    return pytester.runpytest_subprocess(
        "--pyargs",
        "rl.conformance.test_suite",
        "--rl-impl",
        f"broken_ddp:{impl}",
        "-m",
        "rl_ddp",
        "-k",
        "shard_step",
        "-p",
        "no:cacheprovider",
        "-rfs",
        timeout=SUITE_TIMEOUT_S,
    )


def test_the_seed_shard_step_passes_the_ddp_law(pytester: pytest.Pytester) -> None:
    result = run_ddp_law(pytester, "REFERENCE")
    result.assert_outcomes(passed=1)


def test_a_step_that_skips_the_backward_on_an_empty_shard_fails_on_the_empty_shard_case(
    pytester: pytest.Pytester,
) -> None:
    """The tutorial's bug: rank 1's shard is empty, it runs no collective, and rank 0 waits in the all-reduce until the
    timeout. The even and uneven cases (run first, in the same spawn) hold."""
    result = run_ddp_law(pytester, "SKIPS_EMPTY_SHARD")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            f"pytest --pyargs rl.conformance.test_suite::{LAW} --rl-impl broken_ddp:SKIPS_EMPTY_SHARD --rl-seed 0",
            f"FAILED*{LAW}*",
        ]
    )
    out = result.stdout.str()
    assert "case 'empty-shard'" in out and "timed out" in out, out
    assert "a rank with an empty shard must still run the one synchronising backward" in out, out
    assert "case 'even'" not in out and "case 'uneven'" not in out, out


def test_a_step_that_syncs_every_sample_fails_on_the_even_and_uneven_cases(pytester: pytest.Pytester) -> None:
    """Synchronising on every sample gives the right gradient on an even split but two DDP forwards per rank, and on an
    uneven split a different number of all-reduces per rank: the rank with fewer samples leaves its peer waiting."""
    result = run_ddp_law(pytester, "SYNCS_EVERY_SAMPLE")
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert "case 'even'" in out and "DDP.forward [2, 2] times" in out, out
    assert "case 'uneven'" in out and "timed out" in out, out


def test_a_data_parallel_step_that_forgets_the_world_size_fails_the_train_step_law(pytester: pytest.Pytester) -> None:
    """Each rank's losses scaled by 1 / batch instead of world_size / batch: DDP's average over ranks halves the
    gradient on 2 ranks (the shard-step law, given pre-scaled closures, cannot see it)."""
    result = pytester.runpytest_subprocess(
        "--pyargs", "rl.conformance.test_suite", "--rl-impl", "broken_ddp:BATCH_SCALED_TRAINER",
        "-k", "ddp_train_step", "-p", "no:cacheprovider", "-rfs",
        timeout=SUITE_TIMEOUT_S,
    )  # fmt: skip
    result.assert_outcomes(failed=2)  # the even batch's law and the uneven one's: the scale is wrong on both
    out = result.stdout.str()
    assert "reported gradient norm" in out and "(ratio 0.5)" in out, out


def test_a_data_parallel_step_scaled_by_the_local_shard_fails_only_on_uneven_shards(pytester: pytest.Pytester) -> None:
    """Each rank's loss the mean over its own shard: right on the even batch (4 + 4), wrong on 5 samples (3 + 2)."""
    result = pytester.runpytest_subprocess(
        "--pyargs", "rl.conformance.test_suite", "--rl-impl", "broken_ddp:LOCAL_SHARD_SCALED_TRAINER",
        "-k", "ddp_train_step", "-p", "no:cacheprovider", "-rfs",
        timeout=SUITE_TIMEOUT_S,
    )  # fmt: skip
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["FAILED*test_ddp_train_step_on_uneven_shards_equals_the_single_process_step*"])
    out = result.stdout.str()
    assert "shards of 3 and 2), the step reported gradient norm" in out, out
