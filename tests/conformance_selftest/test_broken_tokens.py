"""The token-level laws (issue 47 §1 items 3 and 5) fail the bug each names, run the way a fork runs the suite, and
only that law of its tier; `rl.conformance.bindings.ours` passes them (tests/test_conformance_ours.py and `nox -s
conformance`)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import torch  # noqa: F401
from suite_runner import run_suite

# torch imported here, before any pytester run: an in-process run drops the modules it imported when it ends, and
# importing torch a second time in one process crashes it (test_broken_algorithm.py does the same).

pytest_plugins = ("pytester",)
HERE = Path(__file__).resolve().parent

BOS = "test_engine_prompt_begins_with_its_declared_bos_once"
STOP = "test_engine_completion_ends_at_its_first_declared_stop_id"
BATCH = "test_engine_prompts_of_other_lengths_in_one_call_sample_as_alone"
NORMALISER = "test_each_optimizer_step_of_a_generation_batch_has_the_declared_normaliser"
TRAINER_PADDING = "test_trainer_step_on_prompts_of_other_lengths_computes_the_declared_loss"
TRUNCATED = "test_trainer_masks_truncated_completions_as_declared"
KL_REFERENCE = "test_trainer_kl_at_step_0_from_a_trained_adapter_is_against_the_declared_reference"
FIDELITY = "test_trainer_step_computes_the_declared_loss_on_teacher_forced_logprobs"

# (implementation, tier, laws run, the laws that must fail, what the named law's message must say)
FAST = [
    pytest.param("broken_tokens:DOUBLE_BOS_ENGINE", "rl_engine", {BOS}, r"BOS 11 2 time\(s\)", id="two BOS"),
    pytest.param(
        "broken_tokens:EOS_ONLY_ENGINE", "rl_engine", {STOP}, r"declared stop id 3 at position 0", id="eos only"
    ),
    pytest.param(
        "broken_tokens:RIGHT_PADDING_ENGINE", "rl_engine", {BATCH}, "padding reached the model", id="right padding"
    ),
    pytest.param(
        "broken_tokens:PER_GENERATION_NORMALISER",
        "rl_generation_batch",
        {f"{NORMALISER}[1]", f"{NORMALISER}[2]"},
        r"gradient_accumulation_steps / steps_per_generation",
        id="generation-batch normaliser",
    ),
]


@pytest.mark.parametrize(("impl", "tier", "failing", "message"), FAST)
def test_a_token_level_bug_fails_its_law_and_no_other(pytester, impl, tier, failing, message):
    run = run_suite(pytester, impl, tier)
    assert run.failed == failing, f"{impl}: failing {sorted(run.failed)}, expected {sorted(failing)}: {run.reports}"
    report = run.reports[sorted(failing)[0]]
    assert re.search(message, report), report
    assert f"--rl-impl {impl}" in report, report


@pytest.mark.parametrize("impl", ["PER_STEP_NORMALISER", "GENERATION_MEAN_NORMALISER"])
def test_a_normaliser_as_declared_passes_the_generation_batch_law(pytester, impl):
    run = run_suite(pytester, f"broken_tokens:{impl}", "rl_generation_batch")
    assert not run.failed, run.reports
    assert len(run.passed) == 3, run.passed


# slow: each runs our real CPU trainer (a tiny model, a few steps) in a subprocess (a second in-process run would import
# transformers again); `nox -s slow` runs them. A trainer wrong on every batch with truncated completions also fails
# the padding law, whose batch has them too.
SLOW = [
    pytest.param(
        "broken_tokens:PAD_BETWEEN_TRAINER",
        {TRAINER_PADDING},
        "never between a prompt and its completion",
        id="pad between",
    ),
    pytest.param(
        "broken_tokens:MASKS_NUMERATOR_ONLY",
        {TRUNCATED, TRAINER_PADDING},
        r"truncated_completions='masked'\) gives",
        id="masked numerator only",
    ),
    pytest.param("broken_tokens:BASE_AS_REFERENCE", {KL_REFERENCE}, "fell back to the base model", id="base reference"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("impl", "failing", "message"), SLOW)
def test_a_token_level_trainer_bug_fails_its_law(pytester, monkeypatch, impl, failing, message):
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")])))
    result = pytester.runpytest_subprocess(
        "--pyargs", "rl.conformance.test_suite", "--rl-impl", impl, "-m", "rl_trainer",
        "-k", f"{TRAINER_PADDING} or {TRUNCATED} or {KL_REFERENCE}", "-p", "no:cacheprovider", "-rfs",
        timeout=600.0,
    )  # fmt: skip
    out = result.stdout.str()
    failed = set(re.findall(r"^FAILED \S*::(test_\w+)", out, re.MULTILINE))
    assert failed == failing, out[-4000:]
    result.assert_outcomes(failed=len(failing), passed=3 - len(failing))
    assert re.search(message, out), out[-4000:]


@pytest.mark.slow
@pytest.mark.parametrize("impl", ["MASKS_TRUNCATED", "INITIAL_ADAPTER_REFERENCE"])
def test_a_trainer_as_declared_passes_the_token_level_trainer_laws(pytester, monkeypatch, impl):
    """truncated_completions='masked' and kl_reference='initial_adapter', each done right, pass the three laws and the
    trainer-fidelity law (which honours the truncation declaration too)."""
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")])))
    result = pytester.runpytest_subprocess(
        "--pyargs", "rl.conformance.test_suite", "--rl-impl", f"broken_tokens:{impl}", "-m", "rl_trainer",
        "-k", f"{TRAINER_PADDING} or {TRUNCATED} or {KL_REFERENCE} or {FIDELITY}", "-p", "no:cacheprovider", "-rfs",
        timeout=600.0,
    )  # fmt: skip
    result.assert_outcomes(passed=4)
