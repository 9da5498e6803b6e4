"""The loss laws of the importance ratio: REINFORCE's gradient at ratio 1, and the clip that caps a stale sample's
gain (or the declared sequence ratio, or CISPO's truncated weight). A mixin of `LossContract`."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from rl.conformance.algorithm_spec import LOSS_FIELDS, AlgorithmSpec, ImportanceRatio, check_spec
from rl.conformance.support.contract_base import explicit_examples, law_settings, tier
from rl.conformance.support.loss_cases import AT_RATIO_ONE, CLIP_CELLS, LOG_RATIO, LossBatch, as_on_policy, loss_batches
from rl.conformance.support.loss_under_test import (
    LossOutcome,
    LossUnderTest,
    call_loss,
    dual_clip_hint,
    measured_weights,
    mismatch,
    skip_unless,
    token_references,
    value_tolerance,
)
from rl.conformance.support.reference import TOLERANCE_FACTOR, Precision, invariant_precision, token_tolerance

__all__ = ["LossRatioLaws"]


@tier("loss")
class LossRatioLaws:
    """REINFORCE at ratio 1 and the clipped ratio (fixtures from `LossContract`)."""

    @law_settings(max_examples=15)
    @explicit_examples(*AT_RATIO_ONE)
    @given(case=loss_batches())
    def test_loss_at_ratio_one_is_reinforce(
        self, loss_under_test: LossUnderTest, algorithm: AlgorithmSpec, case: LossBatch
    ) -> None:
        """With new == old (every ratio 1) and kl_beta 0, every token's gradient is REINFORCE's, `-A_i w_i`, with one
        positive weight `w_i` for all of a completion's tokens whatever its advantage (the aggregation's; its value is
        the aggregation law's business), and a clipped-ratio loss's value is `-sum_i A_i T_i w_i`."""
        law = "REINFORCE at ratio 1"
        spec = check_spec(algorithm)
        case = replace(as_on_policy(case), kl_beta=0.0)
        at = invariant_precision(spec.loss_dtype)
        probe = replace(case, ref=case.new, advantages=(1.0,) * len(case.lengths))
        unit = call_loss(loss_under_test, spec, probe, law).grad
        for i, t in case.tokens():
            w, first = -unit[i][t], -unit[i][0]
            assert math.isfinite(w) and w > 0, (
                f"{law}: with advantage 1 at ratio 1, d loss / d new_logp[{i}][{t}] is {-w!r}: a descent step must "
                "raise the log-prob of a completion with a positive advantage, so it must be < 0"
                + (" (the objective is returned as the loss: its sign is flipped)" if w < 0 else "")
                + f"\n({probe})"
            )
            assert abs(w - first) <= TOLERANCE_FACTOR * at.eps * 2 * abs(first), (
                f"{law}: with advantage 1 at ratio 1, token {t} of completion {i} has gradient {-w!r} and its token 0 "
                f"{-first!r}: every token of a completion must weigh the same\n({probe})"
            )
        weights = [-unit[i][0] for i in range(len(case.lengths))]
        got = call_loss(loss_under_test, spec, case, law)
        wrong = mismatch(spec, got, weights, at)
        hint = ""
        if wrong and spec.importance_ratio in ("clipped", "sequence"):
            cispo = replace(spec, importance_ratio="cispo", ratio_cap=_CISPO_CAPS[0])
            if not mismatch(cispo, got, weights, at):
                hint = (
                    " Its gradient is REINFORCE's and its value is not -sum A T w, so the value is a convention, as "
                    "CISPO's -sg(min(r, C)) A new is (any ratio_cap fits at ratio 1; the clip law tells which): the "
                    f"loss matches {cispo.declared(LOSS_FIELDS)}: declare it if that is your design."
                )
        assert not wrong, (
            f"{law}: {wrong}, where REINFORCE's gradient is -A_i w_i on every token of completion i, with the weight "
            f"w_i = {weights[0]!r}... the loss gives at advantage 1.{hint}\n({got.case})"
        )

    @law_settings(max_examples=15)
    @explicit_examples(*CLIP_CELLS)
    @given(case=loss_batches(log_ratio=LOG_RATIO, gap=st.just(0.0), clip_eps=st.floats(0.05, 0.4)))
    def test_loss_clip_caps_a_stale_samples_gain_on_both_sides_of_the_trust_region(
        self, loss_under_test: LossUnderTest, algorithm: AlgorithmSpec, case: LossBatch
    ) -> None:
        """With kl_beta 0, a token whose ratio is beyond the trust region on the side that would raise the objective
        (A > 0 and r > 1 + eps, or A < 0 and r < 1 - eps) gets exactly zero gradient; beyond it on the other side,
        and inside it, the unclipped term keeps its gradient `-A r w` (PPO's pessimistic min), for ratios up to e^8
        either way. Under `importance_ratio="sequence"` (GSPO) the ratio is the completion's, `exp(mean(new - old))`, on
        every token; under "cispo" no token is flat: each gets `-min(r, ratio_cap) A w`, the detached, truncated
        weight. Skipped when the declaration is on-policy only."""
        law = "clipped ratio"
        spec = check_spec(algorithm)
        skip_unless(spec, law)
        case = replace(case, kl_beta=0.0, ref=case.new)
        at = invariant_precision(spec.loss_dtype)
        weights = measured_weights(loss_under_test, spec, case, law)
        got = call_loss(loss_under_test, spec, case, law)
        rounded = got.case
        ignores_old = all(
            abs(got.grad[j][s] + weights[j] * rounded.advantages[j]) <= 1e-3 * abs(weights[j] * rounded.advantages[j])
            for j, s in rounded.tokens()
        ) and any(abs(rounded.new[j][s] - rounded.old[j][s]) > 0.5 for j, s in rounded.tokens())
        on_policy = replace(spec, importance_ratio="on_policy", ratio_cap=None).declared(LOSS_FIELDS)
        hint = (
            " Every token's gradient is -A w whatever its ratio: the loss ignores old_logp. If stale samples never "
            f"reach it (one PPO epoch, no pipelining), declare {on_policy}."
            if ignores_old
            else ""
        )
        hint += dual_clip_hint(spec, rounded, weights, got, at) or _ratio_hint(spec, got, weights, at)
        if spec.importance_ratio == "cispo":
            wrong = mismatch(spec, got, weights, at)
            assert not wrong, (
                f"{law}: {wrong}: CISPO's token gradient is -min(r, {spec.ratio_cap!r}) A w, its weight truncated and "
                f"detached, never zero.{hint}\n({rounded})"
            )
            return
        for (i, t), token in token_references(spec, rounded).items():
            have, unclipped = got.grad[i][t], -weights[i] * rounded.advantages[i] * token.ratio
            tolerance = token_tolerance(at, weights[i], token)
            band = TOLERANCE_FACTOR * at.eps * token.ratio * (2.0 + abs(rounded.new[i][t]) + abs(rounded.old[i][t]))
            kinks = [1 - rounded.clip_eps, 1 + rounded.clip_eps]
            if spec.dual_clip is not None and rounded.advantages[i] < 0:
                kinks.append(spec.dual_clip)
            at_boundary = any(abs(token.ratio - b) <= band for b in kinks)
            where = (
                f"token {t} of completion {i}: ratio {token.ratio!r}, advantage {rounded.advantages[i]!r}, "
                f"clip_eps {rounded.clip_eps!r}"
            )
            if at_boundary:  # either one-sided gradient (or a tie split between them) is right at the kink
                low, high = sorted((0.0, unclipped))
                assert low - tolerance <= have <= high + tolerance, (
                    f"{law}: {where} (on a clip boundary) has gradient {have!r}, expected one between 0 and "
                    f"{unclipped!r}.{hint}\n({rounded})"
                )
            elif token.side == "capped":
                assert abs(have) <= tolerance, (
                    f"{law}: {where} is beyond the trust region on the gain side: gradient {have!r}, expected 0: a "
                    f"stale sample's gain is not capped (the ratio is not clipped).{hint}\n({rounded})"
                )
            elif token.side == "dual_capped":
                assert abs(have) <= tolerance, (
                    f"{law}: {where} is above the declared dual clip c = {spec.dual_clip!r}, so the objective is c A, "
                    f"flat, and d loss / d new_logp must be 0, got {have!r}.{hint}\n({rounded})"
                )
            else:
                side = "inside the trust region" if token.side == "inside" else "beyond the trust region on the side "
                side += "" if token.side == "inside" else "that lowers the objective (PPO's min keeps r A)"
                assert abs(have - unclipped) <= tolerance, (
                    f"{law}: {where} is {side}, so d loss / d new_logp must be -A r w = {unclipped!r}, got {have!r}"
                    + (
                        ": clipping the ratio without the min cuts the gradient that corrects a move"
                        if have == 0 and not hint
                        else ""
                    )
                    + f".{hint}\n({rounded})"
                )
        tokens = token_references(spec, rounded)
        ratio = "s" if spec.importance_ratio == "sequence" else "r"
        want_value = math.fsum(weights[i] * token.value for (i, _), token in tokens.items())
        tolerance = value_tolerance(at, weights, tokens)
        assert abs(got.value - want_value) <= tolerance, (
            f"{law}: the loss is {got.value!r}, expected {want_value!r}, the weighted sum of "
            f"-min({ratio} A, clip({ratio}, 1 - eps, 1 + eps) A) (tolerance {tolerance:.3g}).{hint}\n({rounded})"
        )


_CISPO_CAPS = (5.0, 2.0, 10.0)
"""The CISPO caps a failure suggests: TRL's recommended epsilon_high (ScaleRL's 5.0), and two round others."""


def _ratio_hint(spec: AlgorithmSpec, got: LossOutcome, weights: Sequence[float], at: Precision) -> str:
    """When the loss matches another declarable importance ratio (GSPO's sequence ratio, CISPO's truncated weight):
    a sentence saying to declare it, or ""."""
    candidates = []
    options: list[tuple[ImportanceRatio, float | None]] = [("sequence", None), *(("cispo", c) for c in _CISPO_CAPS)]
    for ratio, cap in options:
        try:
            candidates.append(replace(spec, importance_ratio=ratio, ratio_cap=cap))
        except ValueError:
            continue  # not declarable with the rest of `spec` (a sequence ratio weighting k3)
    for candidate in candidates:
        if candidate != spec and not mismatch(candidate, got, weights, at):
            return f" The loss matches {candidate.declared(LOSS_FIELDS)}: declare it if that is your design."
    return ""
