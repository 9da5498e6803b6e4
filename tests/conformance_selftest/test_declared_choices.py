"""The choices real libraries make that `AlgorithmSpec` could not declare (GSPO, CISPO, a batch std, a
leave-one-out baseline, SkyRL's KL aggregation, NeMo-RL's KL weight, refused groups of one, a variance floor): a
correct implementation of each passes declared, and undeclared fails exactly the laws listed, each naming the
declaration to make. Some of those laws are invariants of every other declaration (a batch std makes a group depend
on the others; a leave-one-out std does not centre; CISPO's value is not REINFORCE's; a refusal errs wherever a group
of one is sent): what they check is part of the choice, and their failure says so.

Runs the packaged suite the way a fork does (`--rl-impl declared_choices:GSPO`), in pytester's directory.
"""

from __future__ import annotations

import declared_choices
import pytest
from algorithm_laws import (
    ADVANTAGE_LAWS,
    AGGREGATION,
    ALL_EQUAL,
    CLIP,
    INDEPENDENT,
    KL_ESTIMATOR,
    LOSS_LAWS,
    PERMUTATION,
    RANK,
    REINFORCE,
    RELABEL,
    SCALE,
    SINGLETON,
    ZERO_SUM,
    run_algorithm_laws,
)

from rl.conformance import AlgorithmSpec

pytest_plugins = ("pytester",)

_REFUSED = "AlgorithmSpec(singleton_groups='refused')"
_CISPO = "AlgorithmSpec(importance_ratio='cispo', ratio_cap=5.0)"
_BATCH = "AlgorithmSpec(advantage_scale='sample_std', std_scope='batch')"
_LOO = "AlgorithmSpec(advantage_scale='sample_std', advantage_baseline='leave_one_out', std_eps=1e-06)"

# (a correct implementation in declared_choices, {each law it fails undeclared: the declaration its message names})
CHOICES = [
    ("GSPO", {CLIP: "AlgorithmSpec(importance_ratio='sequence')"}),
    ("CISPO", {REINFORCE: _CISPO, AGGREGATION: _CISPO, CLIP: _CISPO}),
    ("BATCH_STD", {INDEPENDENT: _BATCH, SCALE: _BATCH}),
    ("LEAVE_ONE_OUT", {ZERO_SUM: _LOO, SCALE: _LOO}),
    ("SEQUENCE_KL", {KL_ESTIMATOR: "AlgorithmSpec(loss_aggregation='token_mean', kl_aggregation='sequence_mean')"}),
    ("K3_VALUE_K2_GRAD", {KL_ESTIMATOR: "AlgorithmSpec(kl_estimator='k3_value_k2_grad')"}),
    ("VARIANCE_FLOOR", {SCALE: "AlgorithmSpec(std_eps_placement='floor')"}),
    # A refusal raises wherever a law sends a group of one: each such law says to declare it.
    (
        "REFUSED_SINGLETON",
        {law: _REFUSED for law in (ALL_EQUAL, RANK, PERMUTATION, RELABEL, INDEPENDENT, SINGLETON)},
    ),
]


# slow: two in-process runs of the algorithm laws per choice, as test_declared_algorithm's per-choice cases;
# `nox -s slow` runs them in CI.
@pytest.mark.slow
@pytest.mark.parametrize(("attr", "undeclared"), CHOICES, ids=[attr for attr, _ in CHOICES])
def test_a_real_librarys_choice_passes_declared_and_undeclared_names_its_declaration(
    pytester: pytest.Pytester, attr: str, undeclared: dict[str, str]
) -> None:
    impl = getattr(declared_choices, attr)
    tier = ADVANTAGE_LAWS if impl.advantages is not None else LOSS_LAWS
    declared = run_algorithm_laws(pytester, "declared_choices", attr)
    assert not declared.failed, f"{attr} under {impl.algorithm!r}:\n" + "\n".join(
        f"--- {name}\n{text[-3000:]}" for name, text in declared.reports.items()
    )
    assert declared.passed == tier, f"{attr}: passed {sorted(declared.passed)}"

    default = run_algorithm_laws(pytester, "declared_choices", f"{attr}_UNDECLARED")
    assert set(default.failed) == set(undeclared), (
        f"{attr} without its choice: failing laws {sorted(default.failed)}; expected {sorted(undeclared)}"
        + "".join(f"\n--- {name}\n{text[-1500:]}" for name, text in default.reports.items() if name not in undeclared)
    )
    for name, declaration in undeclared.items():
        report = default.reports[name]
        assert f"{declaration}: declare it if that is your design" in report, (
            f"{attr}: {name} failed without saying to declare {declaration}:\n{report[-3000:]}"
        )


@pytest.mark.heavy
def test_a_kl_term_that_should_be_ratio_weighted_and_is_not_fails_the_estimator_law(pytester: pytest.Pytester) -> None:
    """NeMo-RL's KL (k3's value, k2's gradient at every ratio) declared as TRL's k3_ratio: identical at ratio 1, so
    only the KL laws' ratios away from 1 catch it. The message prints the loss fields only, not the declared
    advantage_scale the law never used."""
    run = run_algorithm_laws(pytester, "declared_choices", "K3_VALUE_K2_GRAD_AS_K3_RATIO")
    assert set(run.failed) == {KL_ESTIMATOR}, sorted(run.failed)
    report = run.reports[KL_ESTIMATOR]
    assert "AlgorithmSpec(kl_estimator='k3_value_k2_grad'): declare it if that is your design" in report, report[-3000:]
    message = "\n".join(line for line in report.splitlines() if "AssertionError: declared KL estimator" in line)
    assert "for AlgorithmSpec(kl_estimator='k3_ratio') (" in message, message
    assert "advantage_scale" not in message, message


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"importance_ratio": "cispo"}, "must declare ratio_cap=C"),
        ({"ratio_cap": 5.0}, "must declare ratio_cap=C"),
        ({"importance_ratio": "sequence", "kl_estimator": "k3_ratio"}, "is not declarable"),
        ({"kl_aggregation": "constant"}, "kl_aggregation must be one of None, 'sequence_mean'"),
        ({"kl_aggregation": "sequence_mean", "kl_estimator": "none"}, "drop kl_aggregation"),
        ({"std_scope": "batch", "advantage_scale": "none"}, "scales by the batch's std"),
        ({"std_scope": "batch", "advantage_baseline": "leave_one_out"}, "scales by the batch's std"),
        ({"std_eps_placement": "max"}, "must be one of 'std', 'variance', 'floor'"),
    ],
)
def test_an_undeclarable_combination_says_why(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        AlgorithmSpec(**kwargs)  # type: ignore[arg-type]
