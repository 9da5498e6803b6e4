"""A correct implementation of any declared design passes; undeclared, it fails only the choice laws, saying what to
declare. Our own functions pass under every declaration they support.

Each case runs the packaged suite the way a fork does (`--rl-impl declared_algorithm:SAMPLE_STD`), in pytester's
directory, first under the implementation's true declaration, then under the default `AlgorithmSpec()`.
"""

from __future__ import annotations

import broken_tokens
import declared_algorithm
import declared_choices
import pytest
from algorithm_laws import (
    ADVANTAGE_CHOICES,
    ADVANTAGE_LAWS,
    AGGREGATION,
    CLIP,
    KL,
    KL_ESTIMATOR,
    LOSS_CHOICES,
    LOSS_LAWS,
    SCALE,
    SINGLETON,
    run_algorithm_laws,
)

from rl.conformance import AlgorithmSpec, Implementation
from rl.errors import ImplementationError

pytest_plugins = ("pytester",)

# (a correct implementation in declared_algorithm, {each law it fails undeclared: the declaration its message names})
CHOICES = [
    ("SAMPLE_STD", {SCALE: "AlgorithmSpec(advantage_scale='sample_std')"}),
    ("DR_GRPO", {SCALE: "AlgorithmSpec(advantage_scale='none')"}),
    ("EPS_1E6", {SCALE: "AlgorithmSpec(std_eps=1e-06)"}),
    ("VARIANCE_EPS", {SCALE: "AlgorithmSpec(std_eps_placement='variance')"}),
    ("SINGLETON_REWARD", {SINGLETON: "AlgorithmSpec(singleton_groups='reward')"}),
    ("FLOAT32_ADVANTAGES", {SCALE: "AlgorithmSpec(advantage_dtype='float32')"}),
    ("CONSTANT_NORMALIZER", {AGGREGATION: "AlgorithmSpec(loss_aggregation='constant', loss_normalizer=128.0)"}),
    ("SEQUENCE_SUM", {AGGREGATION: "AlgorithmSpec(loss_aggregation='sequence_sum')"}),
    ("TOKEN_MEAN", {AGGREGATION: "AlgorithmSpec(loss_aggregation='token_mean')"}),
    ("K2", {KL_ESTIMATOR: "AlgorithmSpec(kl_estimator='k2')"}),
    ("NO_KL", {KL_ESTIMATOR: "AlgorithmSpec(kl_estimator='none')"}),
    ("K3_RATIO", {KL_ESTIMATOR: "AlgorithmSpec(kl_estimator='k3_ratio')"}),
    ("KL_CLAMP", {KL_ESTIMATOR: "AlgorithmSpec(kl_clamp=10.0)"}),
    # A dual clip flattens a stale sample's loss for A < 0 above c, where the undeclared clip law expects -A r w.
    ("DUAL_CLIP", {CLIP: "AlgorithmSpec(dual_clip=3.0)"}),
    # Fed a stale sample, a loss that ignores old_logp really does not cap its gain: the clip law is where the
    # `importance_ratio` choice shows.
    ("ON_POLICY", {CLIP: "AlgorithmSpec(importance_ratio='on_policy')"}),
    # The dtype sets the tolerance of every comparison with the reference: both loss choice laws see float32 rounding.
    (
        "FLOAT32_LOSS",
        {AGGREGATION: "AlgorithmSpec(loss_dtype='float32')", KL_ESTIMATOR: "AlgorithmSpec(loss_dtype='float32')"},
    ),
]

SKIPPED_WHEN_DECLARED = {"NO_KL": {KL, KL_ESTIMATOR}, "ON_POLICY": {CLIP}}
"""The laws a declaration makes inapplicable (no KL penalty; no stale sample)."""

OURS = [
    ("OURS_UNSCALED", set()),
    ("OURS_EPS_1E6", set()),
    ("OURS_NO_KL", {KL, KL_ESTIMATOR}),
    ("OURS_ON_POLICY", {CLIP}),
    ("OURS_FLOAT32", set()),
    ("OURS_BFLOAT16", set()),
]


def _tier(impl: Implementation) -> set[str]:
    return ADVANTAGE_LAWS if impl.advantages is not None else LOSS_LAWS


# slow: two in-process runs of the algorithm laws per choice (together too long for `unit`: docs/benchmarks.md);
# `nox -s slow` runs them in CI, and our functions' runs below stay in `unit`.
@pytest.mark.slow
@pytest.mark.parametrize(("attr", "undeclared"), CHOICES, ids=[attr for attr, _ in CHOICES])
def test_a_declared_choice_passes_and_undeclared_fails_only_its_choice_laws(
    pytester: pytest.Pytester, attr: str, undeclared: dict[str, str]
) -> None:
    impl = getattr(declared_algorithm, attr)
    tier, skipped = _tier(impl), SKIPPED_WHEN_DECLARED.get(attr, set())
    declared = run_algorithm_laws(pytester, "declared_algorithm", attr)
    assert not declared.failed, f"{attr} under {impl.algorithm!r}:\n" + "\n".join(
        f"--- {name}\n{text[-3000:]}" for name, text in declared.reports.items()
    )
    assert declared.passed == tier - skipped, f"{attr}: passed {sorted(declared.passed)}"

    default = run_algorithm_laws(pytester, "declared_algorithm", f"{attr}_UNDECLARED")
    assert set(default.failed) == set(undeclared), (
        f"{attr} under AlgorithmSpec(): failing laws {sorted(default.failed)}; expected {sorted(undeclared)}"
        + "".join(f"\n--- {name}\n{text[-1500:]}" for name, text in default.reports.items() if name not in undeclared)
    )
    assert set(undeclared) <= ADVANTAGE_CHOICES | LOSS_CHOICES | {CLIP}
    for name, declaration in undeclared.items():
        report = default.reports[name]
        assert f"{declaration}: declare it if that is your design" in report or f"declare {declaration}." in report, (
            f"{attr}: {name} failed without saying to declare {declaration}:\n{report[-3000:]}"
        )


@pytest.mark.heavy
@pytest.mark.parametrize(("attr", "skipped"), OURS, ids=[attr for attr, _ in OURS])
def test_our_functions_pass_under_each_declaration_they_support(
    pytester: pytest.Pytester, attr: str, skipped: set[str]
) -> None:
    impl = getattr(declared_algorithm, attr)
    run = run_algorithm_laws(pytester, "declared_algorithm", attr)
    assert not run.failed, f"{attr} under {impl.algorithm!r}:\n" + "\n".join(
        f"--- {name}\n{text[-3000:]}" for name, text in run.reports.items()
    )
    provided = (ADVANTAGE_LAWS if impl.advantages else set()) | (LOSS_LAWS if impl.sample_loss else set())
    assert run.passed == provided - skipped, f"{attr}: passed {sorted(run.passed)}, skipped {sorted(run.skipped)}"


def test_every_declaration_field_has_a_choice_case() -> None:
    """Each field of AlgorithmSpec with a non-default value is exercised by some correct implementation above, in
    test_declared_choices or in broken_sampling (`DECLARED`)."""
    from broken_sampling import DECLARED as SAMPLING_CHOICES
    from test_declared_choices import CHOICES as MORE_CHOICES

    declared = {attr: getattr(declared_algorithm, attr).algorithm for attr, _ in CHOICES}
    declared |= {attr: getattr(declared_choices, attr).algorithm for attr, _ in MORE_CHOICES}
    declared |= {attr: impl.algorithm for attr, impl in SAMPLING_CHOICES.items()}
    declared |= {
        attr: impl.algorithm for attr, impl in broken_tokens.DECLARED.items()
    }  # test_broken_tokens.py runs them
    default = AlgorithmSpec()
    changed = {
        name for spec in declared.values() for name in vars(spec) if getattr(spec, name) != getattr(default, name)
    }
    assert changed == set(vars(default)), sorted(set(vars(default)) - changed)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"advantage_scale": "std"}, ValueError, "must be one of 'population_std', 'sample_std', 'none'"),
        ({"kl_estimator": "k1"}, ValueError, "must be one of 'k3', 'k2', 'k3_ratio', 'k3_value_k2_grad', 'none'"),
        ({"dual_clip": 1.0}, ValueError, "dual_clip is the dual clip's c, which must exceed 1"),
        ({"kl_clamp": 10.0, "kl_estimator": "none"}, ValueError, "drop kl_clamp"),
        ({"kl_clamp": "10"}, TypeError, "kl_clamp must be a number or None"),
        ({"std_eps": -1e-4}, ValueError, "std_eps must be finite and >= 0"),
        ({"std_eps": "1e-4"}, TypeError, "std_eps must be a float"),
        ({"loss_aggregation": "constant"}, ValueError, "must declare loss_normalizer=L"),
        ({"loss_normalizer": 1024}, ValueError, "only used by loss_aggregation='constant'"),
        ({"loss_aggregation": "constant", "loss_normalizer": 0}, ValueError, "loss_normalizer must be finite and > 0"),
    ],
)
def test_an_inconsistent_declaration_says_what_to_set(kwargs, error, message):
    with pytest.raises(error, match=message):
        AlgorithmSpec(**kwargs)


def test_a_binding_that_cannot_express_its_declaration_is_refused():
    with pytest.raises(ImplementationError, match="bind `batch_loss`"):
        Implementation(
            name="x", sample_loss=declared_algorithm.no_kl_loss, algorithm=AlgorithmSpec(loss_aggregation="token_mean")
        )
    with pytest.raises(ImplementationError, match="bind one"):
        Implementation(
            name="x", sample_loss=declared_algorithm.no_kl_loss, batch_loss=declared_algorithm.on_policy_loss
        )
    with pytest.raises(ImplementationError, match=r"must be a rl\.conformance\.AlgorithmSpec"):
        Implementation(name="x", algorithm="sample_std")  # type: ignore[arg-type]
