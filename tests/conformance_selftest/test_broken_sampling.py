"""The sampling-distribution and behaviour-policy laws catch the bugs they were written from: each broken
implementation fails exactly the laws it breaks, with a message that names the bug; ours pass them."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from suite_runner import run_suite

pytest_plugins = ("pytester",)
HERE = Path(__file__).resolve().parent

TRUNCATED = "test_engine_records_the_tempered_truncated_distribution_it_samples"
TEACHER_FORCED = "test_trainer_teacher_forces_the_distribution_the_batch_was_sampled_from"
STALE = "test_trainer_stale_loss_divides_by_the_recorded_behaviour_logprobs"
TOKEN = "test_token_logprobs_are_those_of_the_sampling_distribution"
LAWS = f"{TRUNCATED} or {TEACHER_FORCED} or {STALE} or {TOKEN}"
CUTS = ("temperature", "top_k", "top_p")

# (implementation, tiers run, the law that names the bug, what its message must say, every law that must fail)
CASES = [
    pytest.param(
        "broken_sampling:UNTEMPERED_RECORDS_ENGINE",
        "rl_engine",
        f"{TRUNCATED}[temperature]",
        r"It is the log-prob at temperature 1: record the log-probs after the temperature",
        {f"{TRUNCATED}[{c}]" for c in CUTS},
        id="engine records log-probs before the temperature (TRL #4159)",
    ),
    pytest.param(
        "broken_sampling:UNTEMPERED_TRAINER",
        "rl_trainer",
        f"{TEACHER_FORCED}[temperature]",
        r"teacher-forces another distribution than the batch was sampled from",
        {*(f"{TEACHER_FORCED}[{c}]" for c in CUTS), f"{STALE}[1]", f"{STALE}[2]"},
        id="trainer scores without the temperature (TRL PR #3029)",
    ),
    pytest.param(
        "broken_sampling:RECOMPUTING_TRAINER",
        "rl_trainer",
        f"{STALE}[1]",
        r"The loss did not move: the trainer replaced the recorded log-probs with its own",
        {f"{STALE}[1]", f"{STALE}[2]"},
        id="trainer recomputes the behaviour log-probs",
    ),
]


@pytest.mark.parametrize(("impl", "tiers", "law", "message", "failing"), CASES)
def test_the_sampling_laws_fail_a_broken_implementation_on_the_law_it_breaks(
    pytester, impl, tiers, law, message, failing
):
    run = run_suite(pytester, impl, tiers, "-k", LAWS)
    assert run.failed == failing, f"{impl}: failing laws {sorted(run.failed)}; expected {sorted(failing)}"
    assert not run.skipped, f"{impl}: laws skipped instead of run: {sorted(run.skipped)}"
    assert re.search(message, run.reports[law]), f"{law} failed without saying {message!r}:\n{run.reports[law]}"


def _subprocess_run(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, impl: str, laws: str = LAWS
) -> pytest.RunResult:
    """The torch laws run in a subprocess: pytester's in-process runs re-import torch, which it does not survive."""
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")])))
    return pytester.runpytest_subprocess(
        "--pyargs", "rl.conformance.test_suite", "--rl-impl", impl, "-k", laws, "-p", "no:cacheprovider", "-rfs",
        timeout=600.0,
    )  # fmt: skip


@pytest.mark.heavy
def test_a_log_prob_function_without_the_temperature_fails_the_token_logprob_law(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TRL 0.15's `_get_per_token_logps` (log softmax of the raw logits) as our batched teacher forcing without its
    settings: the three tempered cases fail, saying so; the default passes."""
    run = _subprocess_run(pytester, monkeypatch, "broken_sampling:UNTEMPERED_TOKEN_LOGPROBS", TOKEN)
    run.assert_outcomes(failed=3, passed=1)
    run.stdout.fnmatch_lines(["*It is the log-prob at temperature 1: divide the logits by the sampling temperature*"])
    for cut in CUTS:
        run.stdout.fnmatch_lines([f"FAILED *{TOKEN}[[]{cut}[]]*"])


@pytest.mark.heavy
def test_a_log_prob_function_that_ignores_the_cut_passes_declared_and_fails_the_cuts_undeclared(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TRL 0.16's choice (log softmax(logits / T), no renormalisation over the top-k/top-p cut) is correct when
    declared `logprob_truncation="ignored"`; undeclared, the two cut cases fail and the rest pass."""
    _subprocess_run(pytester, monkeypatch, "broken_sampling:IGNORED_TRUNCATION", TOKEN).assert_outcomes(passed=4)
    run = _subprocess_run(pytester, monkeypatch, "broken_sampling:UNDECLARED_IGNORED_TRUNCATION", TOKEN)
    run.assert_outcomes(failed=2, passed=2)
    for cut in ("top_k", "top_p"):
        run.stdout.fnmatch_lines([f"FAILED *{TOKEN}[[]{cut}[]]*"])


@pytest.mark.heavy
def test_the_real_cpu_stack_passes_the_sampling_laws(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    _subprocess_run(pytester, monkeypatch, "rl.conformance.bindings.ours:REAL_CPU").assert_outcomes(
        passed=3 + 3 + 2 + 4
    )


def test_the_in_memory_tiers_pass_the_sampling_laws(pytester: pytest.Pytester) -> None:
    run = run_suite(pytester, "rl.conformance.bindings.ours:IN_MEMORY", "rl_engine or rl_trainer", "-k", LAWS)
    assert not run.failed, run.reports
    assert not run.skipped, sorted(run.skipped)
    assert len(run.passed) == 3 + 3 + 2, sorted(run.passed)
