"""The advantage and loss invariants catch real bugs: each broken implementation in `broken_algorithm` fails exactly the
laws listed for it, each with a message that names what broke, and the reference passes every one of them.

Every case runs the packaged suite the way a fork does (`pytest --pyargs rl.conformance.test_suite --rl-impl ...`), in
pytester's directory, without our conftest.py. `test_declared_algorithm` shows the other half: a correct implementation
of another design choice passes once declared, and fails only the choice laws undeclared.
"""

from __future__ import annotations

import broken_algorithm
import pytest
from algorithm_laws import (
    ADVANTAGE_INVARIANTS,
    ADVANTAGE_LAWS,
    AGGREGATION,
    ALL_EQUAL,
    CLIP,
    INDEPENDENT,
    KL,
    KL_ESTIMATOR,
    LOSS_INVARIANTS,
    LOSS_LAWS,
    PADDING,
    PERMUTATION,
    RANK,
    REINFORCE,
    RELABEL,
    SCALAR,
    SCALE,
    SINGLETON,
    TIERS,
    ZERO_SUM,
    run_algorithm_laws,
)

from rl.conformance import Implementation

pytest_plugins = ("pytester",)
# broken_algorithm imports torch here, before any pytester run: an in-process run drops the modules it imported when it
# ends, and importing torch a second time in one process crashes it.

# (broken implementation in broken_algorithm, {every law it fails: what that law's failure must say}). The first law
# listed is the invariant the bug breaks; the others fail with it because the bug really changes what they check.
CASES = [
    # eps dropped: the scale law sees eps = 0 (and says so), and a group of one divides 0 by 0.
    (
        "NO_EPS",
        {
            ALL_EQUAL: "NaN/inf is 0/0",
            SCALE: "They match AlgorithmSpec(std_eps=0.0)",
            SINGLETON: "got advantage nan",
        },
    ),
    ("TUTORIAL", {ALL_EQUAL: "so a trainer's `advantage == 0.0` skip never fires"}),
    ("TRL_FLOAT32", {ALL_EQUAL: "group 1007 = [0.1] * 7"}),
    ("OPENRLHF_FLOAT32", {ALL_EQUAL: "gives large same-sign advantages"}),
    ("VERL_FLOAT32", {ALL_EQUAL: "gives large same-sign advantages"}),
    ("NOT_CENTRED", {ZERO_SUM: "they are not centred on the group's mean", SCALE: "No declarable scale"}),
    ("SIGN_FLIPPED", {RANK: "advantages must rise with the reward", SCALE: "divide by -0.5001"}),
    # Splitting an interleaved group into runs of one gives its members zeros: not ranked, not the declared scale.
    ("CONTIGUOUS_GROUPS", {PERMUTATION: "permutation equivariance: sample", RANK: "rank", SCALE: "declared scale"}),
    ("BATCH_STD", {INDEPENDENT: "once only the other groups' rewards changed", SCALE: "declared scale"}),
    # Returning the advantages in sorted-by-id order puts other groups' values at a group's positions.
    (
        "SORTED_BY_GROUP",
        {
            RELABEL: "relabelling: sample",
            PERMUTATION: "permutation equivariance",
            INDEPENDENT: "independent groups",
            ZERO_SUM: "zero mean",
            ALL_EQUAL: "no-signal group",
            RANK: "rank",
            SCALE: "declared scale",
            SINGLETON: "singleton group",
        },
    ),
    # The objective returned as the loss: the choice laws, which divide out the measured weight, see its sign too.
    (
        "ADVANTAGE_SIGN_FLIPPED",
        {
            REINFORCE: "the objective is returned as the loss: its sign is flipped",
            AGGREGATION: "declared aggregation",
            KL_ESTIMATOR: "declared KL estimator",
        },
    ),
    ("KL_SIGN_FLIPPED", {KL: "a negative loss rewards moving away", KL_ESTIMATOR: "No declarable estimator"}),
    ("K1_KL", {KL: "a k1 penalty (mean(new - ref)) has gradient kl_beta / T there", KL_ESTIMATOR: "declared KL"}),
    ("UNCLIPPED_RATIO", {CLIP: "a stale sample's gain is not capped"}),
    ("CLAMP_ONLY", {CLIP: "clipping the ratio without the min cuts the gradient"}),
    ("UNMASKED_KL", {PADDING: "the mask is not applied", KL_ESTIMATOR: "declared KL estimator"}),
    # The KL summed per completion beside a per-completion mean: a weighting the suite can name since kl_aggregation.
    ("KL_SUMMED", {KL_ESTIMATOR: "The loss matches AlgorithmSpec(kl_aggregation='sequence_sum')"}),
    ("KEEPDIM", {SCALAR: "sample_loss returned a loss of shape (1,), expected a 0-d tensor"}),
    # Right on the rewards the hints probe, wrong near 1e6 (float32-sized errors): no hint may propose the declaration
    # already made.
    ("ONE_PASS_VARIANCE", {SCALE: "They match AlgorithmSpec(advantage_dtype='float32')"}),
    # A normaliser that depends on the batch: no hint may propose the loss_normalizer one batch implies.
    ("BATCH_MAX_LENGTH", {AGGREGATION: "a normaliser that depends on the batch"}),
]


# slow: one in-process run of the algorithm laws per bug (together too long for `unit`: docs/benchmarks.md);
# `nox -s slow` runs them in CI, and the reference run below stays in `unit`.
@pytest.mark.slow
@pytest.mark.parametrize(("attr", "expected"), CASES, ids=[attr for attr, _ in CASES])
def test_a_broken_algorithm_fails_exactly_the_laws_it_breaks(
    pytester: pytest.Pytester, attr: str, expected: dict[str, str]
) -> None:
    run = run_algorithm_laws(pytester, "broken_algorithm", attr)
    assert set(run.failed) == set(expected), (
        f"{attr}: failing laws {sorted(run.failed)}; expected {sorted(expected)}"
        + "".join(f"\n--- {name}\n{text[-1500:]}" for name, text in run.reports.items() if name not in expected)
    )
    tier = ADVANTAGE_LAWS if expected.keys() <= ADVANTAGE_LAWS else LOSS_LAWS
    assert run.passed == tier - set(expected), f"{attr}: passed {sorted(run.passed)}, skipped {sorted(run.skipped)}"
    assert run.skipped == (ADVANTAGE_LAWS | LOSS_LAWS) - tier, f"{attr}: skipped {sorted(run.skipped)}"
    for name, message in expected.items():
        report = run.reports[name]
        assert message in report, f"{attr}: {name} failed without saying {message!r}:\n{report[-3000:]}"
        declared = getattr(broken_algorithm, attr).algorithm.declared()
        assert f"They match {declared}:" not in report and f"matches {declared}:" not in report, (
            f"{attr}: {name} proposes the declaration already made, {declared}:\n{report[-3000:]}"
        )
        assert f"--rl-impl broken_algorithm:{attr}" in report, f"{name}'s report has no reproduce line"


@pytest.mark.heavy
def test_the_reference_passes_every_algorithm_law(pytester: pytest.Pytester) -> None:
    run = run_algorithm_laws(pytester, "broken_algorithm", "REFERENCE")
    assert not run.failed, "\n".join(f"--- {name}\n{text}" for name, text in run.reports.items())
    assert not run.skipped, sorted(run.skipped)
    assert run.passed == ADVANTAGE_LAWS | LOSS_LAWS, sorted(run.passed)


def test_every_invariant_is_caught_failing_by_some_bug_under_its_own_name() -> None:
    """Every invariant is the first law some broken implementation fails (the bug it exists for), and every case names
    one in broken_algorithm."""
    assert all(isinstance(getattr(broken_algorithm, attr, None), Implementation) for attr, _ in CASES)
    first = {next(iter(expected)) for _, expected in CASES}
    assert first >= ADVANTAGE_INVARIANTS | LOSS_INVARIANTS, sorted(ADVANTAGE_INVARIANTS | LOSS_INVARIANTS - first)


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
            "*neither provides no `batch_loss` or `sample_loss` factory, so the GRPO loss laws do not apply*",
        ]
    )
