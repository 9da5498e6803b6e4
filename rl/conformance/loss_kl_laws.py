"""The loss laws of the KL penalty: non-negative and pulling towards the reference, and the declared estimator, clamp
and aggregation, at ratios away from 1. A mixin of `LossContract`."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from rl.conformance.algorithm_spec import LOSS_FIELDS, AlgorithmSpec, check_spec
from rl.conformance.support.contract_base import explicit_examples, law_settings, tier
from rl.conformance.support.loss_cases import KL_CELLS, KL_LOG_RATIO, LossBatch, loss_batches
from rl.conformance.support.loss_under_test import (
    HINT_DTYPES,
    KL_AGGREGATIONS,
    KL_CLAMPS,
    KL_ESTIMATORS,
    LossOutcome,
    LossUnderTest,
    call_loss,
    fresh,
    kl_part,
    kl_weights,
    matching_declaration,
    measured_weights,
    mismatch,
    skip_unless,
    token_references,
)
from rl.conformance.support.reference import TOLERANCE_FACTOR, invariant_precision, precision

__all__ = ["LossKlLaws"]


@tier("loss")
class LossKlLaws:
    """The KL penalty's invariant and its declared estimator (fixtures from `LossContract`)."""

    @law_settings(max_examples=15)
    @explicit_examples(*KL_CELLS)
    @given(
        case=loss_batches(
            advantage=st.just(0.0), log_ratio=KL_LOG_RATIO, kl_beta=st.floats(min_value=0.01, max_value=0.5)
        )
    )
    def test_loss_kl_penalty_is_nonnegative_and_pulls_towards_the_reference(
        self, loss_under_test: LossUnderTest, algorithm: AlgorithmSpec, case: LossBatch
    ) -> None:
        """With advantage 0, at ratios from e^-2 to e^2 (1 when the declaration is on-policy only), the loss is the KL
        penalty alone: exactly 0 with zero gradient where new == ref, >= 0 where new != ref, and its gradient never
        moves a token's new_logp away from ref (k1, `new - ref`, breaks both). Skipped when the declaration has no KL
        penalty."""
        law = "KL penalty"
        spec = check_spec(algorithm)
        skip_unless(spec, law)
        case = replace(fresh(spec, case), advantages=(0.0,) * len(case.lengths))
        eps = invariant_precision(spec.loss_dtype).eps
        at_ref = call_loss(loss_under_test, spec, replace(case, ref=case.new), law)
        assert abs(at_ref.value) <= TOLERANCE_FACTOR * eps * case.kl_beta, (
            f"{law}: with new == ref and advantage 0 the loss must be 0, got {at_ref.value!r}\n({at_ref.case})"
        )
        for i, t in case.tokens():
            g = at_ref.grad[i][t]
            assert abs(g) <= TOLERANCE_FACTOR * eps * case.kl_beta, (
                f"{law}: at new == ref the KL penalty is at its minimum, so d loss / d new_logp[{i}][{t}] must be 0, "
                f"got {g!r}; a k1 penalty (mean(new - ref)) has gradient kl_beta / T there\n({at_ref.case})"
            )
        got = call_loss(loss_under_test, spec, case, law)
        floor = TOLERANCE_FACTOR * eps * case.kl_beta * len(case.tokens())
        assert got.value >= -floor, (
            f"{law}: with advantage 0 and new != ref the loss is kl_beta * KL >= 0, got {got.value!r}: a negative "
            "loss rewards moving away from the reference (the KL sign flipped, or an estimator that can go negative "
            f"such as k1)\n({got.case})"
        )
        for i, t in case.tokens():
            g, gap = got.grad[i][t], got.case.ref[i][t] - got.case.new[i][t]
            # Gradient descent moves new by -g: towards ref = new + gap needs -g to have gap's sign.
            assert g == 0.0 or gap == 0.0 or math.copysign(1.0, -g) == math.copysign(1.0, gap), (
                f"{law}: token {t} of completion {i} has ref - new = {gap!r} but d loss / d new_logp = {g!r}: a "
                f"descent step moves it away from the reference\n({got.case})"
            )

    @law_settings(max_examples=15)
    @explicit_examples(*KL_CELLS)
    @given(case=loss_batches(log_ratio=KL_LOG_RATIO, kl_beta=st.floats(min_value=0.01, max_value=0.5)))
    def test_loss_kl_penalty_is_the_declared_estimator(
        self, loss_under_test: LossUnderTest, algorithm: AlgorithmSpec, case: LossBatch
    ) -> None:
        """At ratios from e^-2 to e^2 (1 when on-policy only), the KL term's share of the loss (the loss less the same
        call with kl_beta 0, so whatever surrogate the loss has) is each token's `kl_beta k(ref - new)` with the
        declared estimator (k3: `exp(d) - d - 1`; k2: `d^2 / 2`; k3_ratio: k3 times the ratio, so a KL term that
        should be ratio-weighted and is not fails here; k3_value_k2_grad: k3's value, k2's gradient), clamp and
        aggregation (the surrogate's unless `kl_aggregation` says otherwise), for reference gaps up to 8 nats: value
        and gradient within the declared dtype's tolerance. Skipped when the declaration has no KL penalty."""
        law = "declared KL estimator"
        spec = check_spec(algorithm)
        skip_unless(spec, law)
        case = fresh(spec, case)
        weights = measured_weights(loss_under_test, spec, case, law)
        whole = call_loss(loss_under_test, spec, case, law)
        got = kl_part(whole, call_loss(loss_under_test, spec, replace(case, kl_beta=0.0), law))
        wrong = mismatch(spec, got, weights, precision(spec.loss_dtype), kl_only=True)
        if wrong:
            candidates = []
            for kl, clamp, aggregation, dtype in itertools.product(
                KL_ESTIMATORS, KL_CLAMPS, KL_AGGREGATIONS, HINT_DTYPES
            ):
                try:
                    candidate = replace(
                        spec, kl_estimator=kl, kl_clamp=clamp, kl_aggregation=aggregation, loss_dtype=dtype
                    )
                except ValueError:
                    continue  # not declarable (a clamp without a KL term, a token mean of a sample_loss's ...)
                candidates.append((candidate, weights))
            probe = fresh(spec, KL_CELLS[-1])  # ratios away from 1, where k3_ratio and k3_value_k2_grad differ
            probe_got = kl_part(
                call_loss(loss_under_test, spec, probe, law),
                call_loss(loss_under_test, spec, replace(probe, kl_beta=0.0), law),
            )
            probe_weights = measured_weights(loss_under_test, spec, probe, law)
            fits = matching_declaration(
                candidates, spec, got, kl_only=True, also=[(probe_got, probe_weights)]
            ) or _kl_diagnosis(spec, got, weights)
            aggregated = (
                "weighted as the surrogate is"
                if spec.kl_aggregation is None
                else f"aggregated as {spec.kl_aggregation}"
            )
            raise AssertionError(
                f"{law}: the KL term's share of the loss (the loss less the same call with kl_beta 0): {wrong}, for "
                f"{spec.declared(LOSS_FIELDS)} ({spec.kl_estimator}, {aggregated}, at "
                f"{spec.loss_dtype} precision). {fits}\n({got.case})"
            )


def _kl_diagnosis(spec: AlgorithmSpec, got: LossOutcome, weights: Sequence[float]) -> str:
    """When no declaration fits: whether the KL part of the gradient is some declarable estimator weighted by another
    per-completion factor (the weighting is wrong), or no estimator under any weighting (the estimator is wrong)."""
    case = got.case
    for kl in KL_ESTIMATORS[:-1]:
        try:
            candidate = replace(spec, kl_estimator=kl)
        except ValueError:
            continue
        tokens = token_references(candidate, case)
        kl_w = kl_weights(candidate, case.lengths, weights)
        factors: dict[int, list[float]] = {}
        for (i, t), token in tokens.items():
            if abs(token.kl_grad) > 1e-3 * case.kl_beta:
                factors.setdefault(i, []).append(got.grad[i][t] / (kl_w[i] * token.kl_grad))
        consistent = all(max(f) - min(f) <= 1e-4 * max(1.0, max(abs(x) for x in f)) for f in factors.values())
        if factors and consistent and all(f[0] > 0 for f in factors.values()):
            per_row = {i: round(f[0], 6) for i, f in factors.items()}
            return (
                f"The KL term is {kl} weighted {per_row} times the surrogate's weight, per completion: the "
                "weighting differs (e.g. summed over tokens where the surrogate is averaged); if it is a design, "
                "declare its kl_aggregation."
            )
    return (
        "No declarable estimator matches under any per-completion weighting: the KL term's weighting is not the "
        "cause, the estimator itself differs (its sign, its formula, or a ratio weight it lacks or adds)."
    )
