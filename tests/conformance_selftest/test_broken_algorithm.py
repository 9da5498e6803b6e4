"""The advantage and loss laws catch real bugs: each broken implementation in `broken_algorithm` fails exactly the laws
listed for it, each with a message that names what broke, and the reference passes every one of them.

Every case runs the packaged suite the way a fork does (`pytest --pyargs rl.conformance.test_suite --rl-impl ...`), in
pytester's directory, without our conftest.py.
"""

from __future__ import annotations

import broken_algorithm
import pytest
from suite_runner import SuiteRun, run_suite

from rl.conformance import Implementation

pytest_plugins = ("pytester",)
# broken_algorithm imports torch here, before any pytester run: an in-process run drops the modules it imported when it
# ends, and importing torch a second time in one process crashes it.

TIERS = "rl_advantages or rl_loss"

SCALE = "test_advantages_scale_by_the_population_std"
ALL_EQUAL = "test_advantages_of_an_all_equal_group_are_exactly_zero"
ZERO_SUM = "test_advantages_sum_to_zero_within_each_group"
PERMUTATION = "test_advantages_permuting_samples_permutes_advantages"
RELABEL = "test_advantages_relabelling_group_ids_changes_nothing"
INDEPENDENT = "test_advantages_of_a_group_do_not_depend_on_other_groups"
ADVANTAGE_LAWS = {SCALE, ALL_EQUAL, ZERO_SUM, PERMUTATION, RELABEL, INDEPENDENT}

KL = "test_loss_kl_penalty_is_nonnegative_and_pulls_towards_the_reference"
CLIP = "test_loss_clip_zeroes_the_gradient_beyond_the_trust_region"
PESSIMISTIC = "test_loss_clip_is_pessimistic_outside_the_trust_region"
REINFORCE = "test_loss_at_ratio_one_is_reinforce"
TOKEN_MEAN = "test_loss_is_the_token_mean"
SCALAR = "test_loss_is_a_finite_differentiable_scalar"
LOSS_LAWS = {KL, CLIP, PESSIMISTIC, REINFORCE, TOKEN_MEAN, SCALAR}

# (broken implementation in broken_algorithm, {every law it fails: what that law's failure must say})
CASES = [
    ("SAMPLE_STD", {SCALE: "population std: the group [0.0, 1.0] gave advantages"}),
    ("NO_EPS", {ALL_EQUAL: "NaN/inf is 0/0"}),
    ("NOT_CENTRED", {ZERO_SUM: "zero mean: group"}),
    ("BATCH_STD", {INDEPENDENT: "once only the other groups' rewards changed"}),
    ("CONTIGUOUS_GROUPS", {PERMUTATION: "permutation equivariance: sample"}),
    # Returning the advantages in sorted-by-id order puts other groups' values at a group's positions.
    (
        "SORTED_BY_GROUP",
        {
            RELABEL: "relabelling: sample",
            PERMUTATION: "permutation equivariance",
            INDEPENDENT: "independent groups",
            ZERO_SUM: "zero mean",
            ALL_EQUAL: "all-equal group",
        },
    ),
    ("KL_SIGN_FLIPPED", {KL: "KL penalty: with advantage 0 and new != ref the loss is kl_beta * KL > 0"}),
    ("K1_KL", {KL: "a k1 penalty (mean(new - ref)) has gradient kl_beta / T there"}),
    ("UNCLIPPED_RATIO", {CLIP: "must be exactly 0"}),
    ("CLAMP_ONLY", {PESSIMISTIC: "the unclipped r A, so d loss / d new_logp must be -A * r / T"}),
    # A flipped sign also flips the unclipped gradient the pessimistic law checks.
    ("ADVANTAGE_SIGN_FLIPPED", {REINFORCE: "REINFORCE at ratio 1: the loss must be -A", PESSIMISTIC: "-A * r / T"}),
    # A sum is T times the mean: the value at ratio 1 and every per-token gradient are off by T too.
    (
        "TOKEN_SUM",
        {TOKEN_MEAN: "copies of one token must have that token's loss", REINFORCE: "-A", PESSIMISTIC: "-A * r / T"},
    ),
    ("KL_SUMMED", {TOKEN_MEAN: "copies of one token must have that token's loss"}),
    ("KEEPDIM", {SCALAR: "the loss has shape (1,), expected a 0-d tensor"}),
]


def run_algorithm_laws(pytester: pytest.Pytester, attr: str) -> SuiteRun:
    run = run_suite(pytester, f"broken_algorithm:{attr}", TIERS)
    assert not run.errors, f"{attr}: laws errored outside their bodies (a fixture or the binding broke): {run.errors}"
    return run


@pytest.mark.parametrize(("attr", "expected"), CASES, ids=[attr for attr, _ in CASES])
def test_a_broken_algorithm_fails_exactly_the_laws_it_breaks(
    pytester: pytest.Pytester, attr: str, expected: dict[str, str]
) -> None:
    run = run_algorithm_laws(pytester, attr)
    assert set(run.failed) == set(expected), (
        f"{attr}: failing laws {sorted(run.failed)}; expected {sorted(expected)}"
        + "".join(f"\n--- {name}\n{text[-1500:]}" for name, text in run.reports.items() if name not in expected)
    )
    tier = ADVANTAGE_LAWS if expected.keys() <= ADVANTAGE_LAWS else LOSS_LAWS
    assert run.passed == tier - set(expected), f"{attr}: passed {sorted(run.passed)}, skipped {sorted(run.skipped)}"
    assert run.skipped == (ADVANTAGE_LAWS | LOSS_LAWS) - tier, f"{attr}: skipped {sorted(run.skipped)}"
    for name, message in expected.items():
        report = run.reports[name]
        assert message in report, f"{attr}: {name} failed without saying {message!r}:\n{report}"
        assert f"--rl-impl broken_algorithm:{attr}" in report, f"{name}'s report has no reproduce line"


def test_the_reference_passes_every_algorithm_law(pytester: pytest.Pytester) -> None:
    run = run_algorithm_laws(pytester, "REFERENCE")
    assert not run.failed, "\n".join(f"--- {name}\n{text}" for name, text in run.reports.items())
    assert not run.skipped, sorted(run.skipped)
    assert run.passed == ADVANTAGE_LAWS | LOSS_LAWS, sorted(run.passed)


def test_every_algorithm_law_is_caught_failing_by_some_case() -> None:
    """Every law fails on some broken implementation, and every case names one in broken_algorithm."""
    assert all(isinstance(getattr(broken_algorithm, attr, None), Implementation) for attr, _ in CASES)
    caught = set().union(*(expected.keys() for _, expected in CASES))
    assert caught == ADVANTAGE_LAWS | LOSS_LAWS, sorted((ADVANTAGE_LAWS | LOSS_LAWS) - caught)


def test_an_implementation_without_them_skips_the_algorithm_laws_naming_the_factory(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(neither="from rl.conformance import Implementation\nNEITHER = Implementation(name='neither')\n")
    pytester.syspathinsert()
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    result = pytester.runpytest(
        "--pyargs", "rl.conformance.test_suite", "--rl-impl", "neither:NEITHER", "-m", TIERS, "-rs",
        "-p", "no:cacheprovider",
    )  # fmt: skip
    result.assert_outcomes(skipped=len(ADVANTAGE_LAWS | LOSS_LAWS))
    result.stdout.fnmatch_lines(
        [
            "*neither provides no `advantages` factory, so the advantage laws do not apply*",
            "*neither provides no `sample_loss` factory, so the GRPO loss laws do not apply*",
        ]
    )
