"""The loss laws: GRPO's clipped-ratio loss with its KL penalty, checked on a padded batch as a trainer calls it.

Provide the loss in one of two forms (and, when your choices differ from ours, the `algorithm` fixture):

    class TestMyLoss(LossContract):
        @pytest.fixture
        def batch_loss(self):
            return my_batch_loss  # (new_logp, old_logp, ref_logp, advantages, mask, *, clip_eps, kl_beta) -> loss

        @pytest.fixture
        def algorithm(self):
            return AlgorithmSpec(loss_aggregation="token_mean", kl_estimator="none")

`batch_loss` takes `[B, T]` log-prob tensors, `[B]` advantages and a `[B, T]` completion mask (1.0 on a completion's
tokens, 0.0 on padding), as TRL-style trainers do, and returns the loss or `(loss, stats)`. A per-completion
`sample_loss(new_logp, old_logp, ref_logp, advantage, clip_eps, kl_beta) -> (loss, stats)` (like
`rl.loss.grpo_sample_loss`) is lifted to that form by `sample_loss_as_batch_loss`: each row's unmasked tokens, then
the mean over rows.

Invariants hold for every declaration: REINFORCE's gradient at ratio 1 (up to the aggregation's positive per-token
weight), a KL penalty that is >= 0, 0 at the reference and never pushes away from it, a clip that caps a stale
sample's gain on both sides of the trust region, padding that changes nothing, a finite differentiable scalar. Choice
laws compare to the float64 reference computed from the declaration (`rl.conformance.reference`) at the declared
dtype's tolerance: the aggregation's weights, the KL estimator. Every law but the aggregation law divides out the
implementation's own per-token weight, measured at ratio 1, so an aggregation mismatch fails that law alone. The
hazardous cells (ratios exactly 1, at and far beyond 1 ± eps, log-prob gaps of 5 and 8 nats, completions of 1 and 64
tokens) are explicit examples run before anything is drawn. torch is imported inside the laws, never at import.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rl.conformance._base import ContractBase, explicit_examples, law_settings, must_provide, tier
from rl.conformance.loss_cases import (
    AT_RATIO_ONE,
    CLIP_CELLS,
    KL_CELLS,
    LOG_RATIO,
    LossBatch,
    as_on_policy,
    cell,
    loss_batches,
    repadded,
)
from rl.conformance.reference import (
    TOLERANCE_FACTOR,
    Precision,
    TokenReference,
    invariant_precision,
    precision,
    token_reference,
    token_tolerance,
    token_weights,
)
from rl.conformance.spec import AlgorithmSpec, KlEstimator, LossAggregation, LossDtype, check_spec

if TYPE_CHECKING:
    from torch import Tensor

__all__ = ["BatchLossFn", "LossContract", "SampleLossFn", "sample_loss_as_batch_loss"]

SampleLossFn = Callable[..., Any]
"""`(new_logp, old_logp, ref_logp, advantage, clip_eps=0.2, kl_beta=0.03) -> (loss, stats)` on 1-D torch tensors of one
completion, like `rl.loss.grpo_sample_loss`."""

BatchLossFn = Callable[..., Any]
"""`(new_logp, old_logp, ref_logp, advantages, mask, *, clip_eps, kl_beta) -> loss` or `(loss, stats)`: `[B, T]`
log-prob tensors, `[B]` advantages, a `[B, T]` mask of 1.0 (a completion's tokens) and 0.0 (padding), all of one
floating dtype; the loss a 0-d tensor differentiable w.r.t. `new_logp`."""


def sample_loss_as_batch_loss(sample_loss: SampleLossFn) -> BatchLossFn:
    """The batch form of a per-completion loss: `sample_loss` on each row's unmasked tokens, then the mean over rows
    (the aggregations "sequence_mean", "constant" and "sequence_sum" are per-completion, then averaged).

    A one-element loss of any shape is taken as its value, so a shape slip fails only the finite-scalar law, which
    checks `sample_loss`'s own output.

    Shape: `new_logp`, `old_logp`, `ref_logp`, `mask`: `[B, T]`; `advantages`: `[B]` -> loss `[]`.
    """

    def batch_loss(
        new_logp: Tensor,
        old_logp: Tensor,
        ref_logp: Tensor,
        advantages: Tensor,
        mask: Tensor,
        *,
        clip_eps: float,
        kl_beta: float,
    ) -> Tensor:
        import torch

        losses = []
        for i in range(new_logp.shape[0]):
            keep = mask[i] > 0  # [T]
            out = sample_loss(
                new_logp[i][keep], old_logp[i][keep], ref_logp[i][keep], float(advantages[i]), clip_eps, kl_beta
            )
            loss = out[0] if isinstance(out, tuple) else out
            losses.append(loss.reshape(()))
        return torch.stack(losses).mean()

    batch_loss.__qualname__ = f"sample_loss_as_batch_loss({getattr(sample_loss, '__qualname__', sample_loss)!s})"
    return batch_loss


# -- calling the loss --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LossUnderTest:
    """The loss the laws call, in batch form, and the per-completion function it was lifted from (if it was)."""

    batch_loss: BatchLossFn
    sample_loss: SampleLossFn | None = None

    @property
    def form(self) -> str:
        return "batch_loss" if self.sample_loss is None else "sample_loss (lifted: each row, then the mean)"


@dataclass(frozen=True)
class _Outcome:
    """A call's loss and d loss / d new_logp, and the inputs as the declared dtype rounded them (what the reference
    is computed from)."""

    value: float
    grad: list[list[float]]
    case: LossBatch


def _call(loss: LossUnderTest, spec: AlgorithmSpec, case: LossBatch, law: str) -> _Outcome:
    import torch

    dtype = getattr(torch, spec.loss_dtype)
    new = torch.tensor(case.new, dtype=dtype, requires_grad=True)  # [B, T]
    old, ref = torch.tensor(case.old, dtype=dtype), torch.tensor(case.ref, dtype=dtype)  # [B, T]
    advantages = torch.tensor(case.advantages, dtype=dtype)  # [B]
    mask = torch.tensor(
        [[1.0] * length + [0.0] * (case.width - length) for length in case.lengths], dtype=dtype
    )  # [B, T]
    rounded = replace(
        case,
        new=tuple(map(tuple, new.detach().double().tolist())),
        old=tuple(map(tuple, old.double().tolist())),
        ref=tuple(map(tuple, ref.double().tolist())),
        advantages=tuple(advantages.double().tolist()),
    )
    out = loss.batch_loss(new, old, ref, advantages, mask, clip_eps=case.clip_eps, kl_beta=case.kl_beta)
    value = out[0] if isinstance(out, tuple) else out
    where = f"{loss.form} on {spec.loss_dtype} tensors ({rounded})"
    assert isinstance(value, torch.Tensor) and value.numel() == 1, (
        f"{law}: {where} returned {type(value).__name__} of shape {tuple(getattr(value, 'shape', ()))}, expected a "
        "tensor of one value (the batch's loss), or (loss, stats)"
    )
    assert value.requires_grad, f"{law}: {where} returned a loss that carries no gradient to new_logp"
    value.reshape(()).backward()
    assert new.grad is not None, f"{law}: {where} gave new_logp no gradient"
    return _Outcome(float(value.detach()), new.grad.double().tolist(), rounded)


def _weights(loss: LossUnderTest, spec: AlgorithmSpec, case: LossBatch, law: str) -> list[float]:
    """The implementation's own weight of each completion's tokens: `-d loss / d new_logp` at ratio 1, advantage 1
    and kl_beta 0 (where the per-token loss is -r A), on the batch's shape; the declared weights where that is 0 or
    not finite (so that a loss with no usable gradient is still compared with something)."""
    probe = replace(case, old=case.new, ref=case.new, advantages=(1.0,) * len(case.lengths), kl_beta=0.0)
    grad = _call(loss, spec, probe, law).grad
    measured = [-grad[i][0] for i in range(len(case.lengths))]
    if all(math.isfinite(w) and w != 0.0 for w in measured):
        return measured
    return token_weights(spec, case.lengths)


def _tokens(spec: AlgorithmSpec, case: LossBatch) -> dict[tuple[int, int], TokenReference]:
    return {
        (i, t): token_reference(
            spec, case.new[i][t], case.old[i][t], case.ref[i][t], case.advantages[i], case.clip_eps, case.kl_beta
        )
        for i, t in case.tokens()
    }


def _value_tolerance(
    at: Precision, weights: Sequence[float], tokens: Mapping[tuple[int, int], TokenReference]
) -> float:
    """The sum over tokens of each weighted term's tolerance, plus a naive sum's rounding over that many terms."""
    per_token = [token_tolerance(at, weights[i], token) for (i, _), token in tokens.items()]
    absolute = math.fsum(abs(weights[i] * token.value) for (i, _), token in tokens.items())
    return math.fsum(per_token) + TOLERANCE_FACTOR * at.eps * len(tokens) * absolute


def _mismatch(spec: AlgorithmSpec, got: _Outcome, weights: Sequence[float], at: Precision) -> str:
    """Where the outcome's gradient (and, for a clipped-ratio loss, its value) differs from the reference of `spec`
    weighted by `weights`, token by token, beyond the tolerance precision `at` earns; "" where it does not."""
    case = got.case
    tokens = _tokens(spec, case)
    for (i, t), token in tokens.items():
        want, have = weights[i] * token.grad, got.grad[i][t]
        tolerance = token_tolerance(at, weights[i], token)
        if not abs(have - want) <= tolerance:
            return (
                f"d loss / d new_logp[{i}][{t}] is {have!r}, expected {want!r} (weight {weights[i]!r} x "
                f"{token.grad!r}; tolerance {tolerance:.3g}; ratio {token.ratio!r}, advantage {case.advantages[i]!r}, "
                f"ref - new {case.ref[i][t] - case.new[i][t]!r})"
            )
    if spec.importance_ratio == "clipped":
        want_value = math.fsum(weights[i] * token.value for (i, _), token in tokens.items())
        tolerance = _value_tolerance(at, weights, tokens)
        if not abs(got.value - want_value) <= tolerance:
            return (
                f"the loss is {got.value!r}, expected {want_value!r} (the weighted sum of the tokens' losses; "
                f"tolerance {tolerance:.3g})"
            )
    return ""


def _fits(candidates: Sequence[tuple[AlgorithmSpec, Sequence[float]]], declared: AlgorithmSpec, got: _Outcome) -> str:
    """The first candidate declaration (other than `declared`, fewest fields changed first) whose reference, with its
    weights and at its dtype's precision, the outcome matches: a sentence saying to declare it, or ""."""
    ranked = sorted(
        candidates, key=lambda c: sum(a != b for a, b in zip(_values(c[0]), _values(declared), strict=True))
    )
    for candidate, weights in ranked:
        if candidate != declared and not _mismatch(candidate, got, weights, precision(candidate.loss_dtype)):
            return f"The loss matches {candidate.declared()}: declare it if that is your design."
    return ""


def _values(spec: AlgorithmSpec) -> tuple[Any, ...]:
    return (spec.loss_aggregation, spec.loss_normalizer, spec.kl_estimator, spec.kl_clamp, spec.loss_dtype)


def _skip_unless(spec: AlgorithmSpec, law: str) -> None:
    if law in _NEEDS_KL and spec.kl_estimator == "none":
        pytest.skip(f"{spec.declared()} declares no KL penalty (the laws pass kl_beta=0.0), so this law does not apply")
    if law in _NEEDS_CLIP and spec.importance_ratio == "on_policy":
        pytest.skip(
            f"{spec.declared()} declares an on-policy loss (the laws pass old_logp = new_logp), so no stale sample "
            "reaches it and this law does not apply"
        )


_NEEDS_KL = {"KL penalty", "declared KL estimator"}
_NEEDS_CLIP = {"clipped ratio"}


def _kl_beta(spec: AlgorithmSpec, beta: float) -> float:
    return 0.0 if spec.kl_estimator == "none" else beta


def _fresh(spec: AlgorithmSpec, case: LossBatch) -> LossBatch:
    """`case` with old_logp = new_logp when the declared loss is on-policy only, and kl_beta 0 when it has no KL."""
    case = replace(case, kl_beta=_kl_beta(spec, case.kl_beta))
    return as_on_policy(case) if spec.importance_ratio == "on_policy" else case


def _dual_clip_hint(
    spec: AlgorithmSpec,
    case: LossBatch,
    weights: Sequence[float],
    got: _Outcome,
    at: Precision,
) -> str:
    """When tokens with A < 0 and a ratio above 1 get zero gradient and no dual clip is declared: the c whose dual clip
    explains the loss's value and every gradient (one unknown: the value is linear in c), as a declaration to make,
    or "" when none does."""
    if spec.dual_clip is not None:
        return ""
    tokens = _tokens(spec, case)
    flat = [
        (i, t)
        for (i, t), token in tokens.items()
        if token.side == "pessimistic" and case.advantages[i] < 0 and got.grad[i][t] == 0.0
    ]
    if not flat:
        return ""
    rest = math.fsum(weights[i] * token.value for (i, t), token in tokens.items() if (i, t) not in flat)
    per_c = math.fsum(-weights[i] * case.advantages[i] for i, _ in flat)
    if per_c <= 0:
        return ""
    c = round((got.value - rest) / per_c, 6)
    if not (math.isfinite(c) and c > 1.0):
        return ""
    candidate = replace(spec, dual_clip=c)
    for (i, t), token in _tokens(candidate, case).items():
        want = weights[i] * token.grad
        if abs(got.grad[i][t] - want) > token_tolerance(at, weights[i], token) + 1e-6 * abs(want):
            return ""
    return (
        f" Tokens with A < 0 and a ratio above {c!r} are flat: a dual clip (verl's clip_ratio_c). The loss matches "
        f"{candidate.declared()}: declare it if that is your design."
    )


@tier("loss")
class LossContract(ContractBase):
    """Laws of GRPO's loss (DeepSeekMath eq. 3, token-level form), aggregated over a batch as declared:

        loss = sum_i sum_t w_i ( -min(r_t A_i, clip(r_t, 1 - eps, 1 + eps) A_i) + kl_beta k(ref_t - new_t) )

    with `r_t = exp(new_t - old_t)`, the declared KL estimator `k` (k3 by default, Schulman's "Approximating KL
    divergence") and the declared aggregation's weights `w_i`. The laws call the loss on CPU tensors of the declared
    dtype, `new_logp` a leaf requiring grad.
    """

    @pytest.fixture
    def batch_loss(self) -> BatchLossFn:
        """Return the batch loss `(new_logp, old_logp, ref_logp, advantages, mask, *, clip_eps, kl_beta) -> loss` (or
        `(loss, stats)`), the tensors `[B, T]` and `[B]`, the mask 1.0 on completion tokens and 0.0 on padding; or
        provide `sample_loss` instead."""
        raise must_provide(
            "LossContract",
            "batch_loss",
            "a callable (new_logp, old_logp, ref_logp, advantages, mask, *, clip_eps, kl_beta) -> loss on [B, T] "
            "tensors (or provide `sample_loss` instead)",
        )

    @pytest.fixture
    def sample_loss(self) -> SampleLossFn:
        """Return the per-completion loss, with the signature of `rl.loss.grpo_sample_loss`:
        `(new_logp, old_logp, ref_logp, advantage, clip_eps=0.2, kl_beta=0.03) -> (loss, stats)`, the tensors 1-D of
        one length, `loss` a 0-d tensor differentiable w.r.t. `new_logp`, `stats` a mapping of floats; or provide
        `batch_loss` instead."""
        raise must_provide(
            "LossContract",
            "sample_loss",
            "a callable (new_logp, old_logp, ref_logp, advantage, clip_eps=0.2, kl_beta=0.03) -> (loss, stats) "
            "like rl.loss.grpo_sample_loss (or provide `batch_loss` instead)",
        )

    @pytest.fixture
    def algorithm(self) -> AlgorithmSpec:
        """Return the `rl.conformance.AlgorithmSpec` your implementation follows; the default is ours."""
        return AlgorithmSpec()

    @pytest.fixture
    def loss_under_test(self, request: pytest.FixtureRequest, algorithm: AlgorithmSpec) -> LossUnderTest:
        """`batch_loss` if the class provides it, else `sample_loss` lifted to the batch form."""
        spec = check_spec(algorithm)
        try:
            return LossUnderTest(request.getfixturevalue("batch_loss"))
        except NotImplementedError:
            pass
        try:
            sample = request.getfixturevalue("sample_loss")
        except NotImplementedError:
            raise must_provide(
                "LossContract",
                "batch_loss` or `sample_loss",
                "the loss under test, in batch form (new_logp, old_logp, ref_logp, advantages, mask, *, clip_eps, "
                "kl_beta) -> loss, or per completion like rl.loss.grpo_sample_loss",
            ) from None
        if spec.loss_aggregation == "token_mean":
            raise ValueError(
                f"{spec.declared()} normalises over the batch's tokens, which a per-completion `sample_loss` cannot "
                "express: provide `batch_loss`, or declare the aggregation your sample_loss has"
            )
        return LossUnderTest(sample_loss_as_batch_loss(sample), sample)

    # -- invariants ----------------------------------------------------------------------------------------------------

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
        unit = _call(loss_under_test, spec, probe, law).grad
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
        got = _call(loss_under_test, spec, case, law)
        wrong = _mismatch(spec, got, weights, at)
        assert not wrong, (
            f"{law}: {wrong}, where REINFORCE's gradient is -A_i w_i on every token of completion i, with the weight "
            f"w_i = {weights[0]!r}... the loss gives at advantage 1\n({got.case})"
        )

    @law_settings(max_examples=15)
    @explicit_examples(*KL_CELLS)
    @given(case=loss_batches(advantage=st.just(0.0), kl_beta=st.floats(min_value=0.01, max_value=0.5)))
    def test_loss_kl_penalty_is_nonnegative_and_pulls_towards_the_reference(
        self, loss_under_test: LossUnderTest, algorithm: AlgorithmSpec, case: LossBatch
    ) -> None:
        """With advantage 0 and ratio 1, the loss is the KL penalty alone: exactly 0 with zero gradient where new ==
        ref, >= 0 where new != ref, and its gradient never moves a token's new_logp away from ref (k1, `new - ref`,
        breaks both). Skipped when the declaration has no KL penalty."""
        law = "KL penalty"
        spec = check_spec(algorithm)
        _skip_unless(spec, law)
        case = replace(as_on_policy(case), advantages=(0.0,) * len(case.lengths))
        eps = invariant_precision(spec.loss_dtype).eps
        at_ref = _call(loss_under_test, spec, replace(case, ref=case.new), law)
        assert abs(at_ref.value) <= TOLERANCE_FACTOR * eps * case.kl_beta, (
            f"{law}: with new == old == ref and advantage 0 the loss must be 0, got {at_ref.value!r}\n({at_ref.case})"
        )
        for i, t in case.tokens():
            g = at_ref.grad[i][t]
            assert abs(g) <= TOLERANCE_FACTOR * eps * case.kl_beta, (
                f"{law}: at new == ref the KL penalty is at its minimum, so d loss / d new_logp[{i}][{t}] must be 0, "
                f"got {g!r}; a k1 penalty (mean(new - ref)) has gradient kl_beta / T there\n({at_ref.case})"
            )
        got = _call(loss_under_test, spec, case, law)
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
    @explicit_examples(*CLIP_CELLS)
    @given(case=loss_batches(log_ratio=LOG_RATIO, gap=st.just(0.0), clip_eps=st.floats(0.05, 0.4)))
    def test_loss_clip_caps_a_stale_samples_gain_on_both_sides_of_the_trust_region(
        self, loss_under_test: LossUnderTest, algorithm: AlgorithmSpec, case: LossBatch
    ) -> None:
        """With kl_beta 0, a token whose ratio is beyond the trust region on the side that would raise the objective
        (A > 0 and r > 1 + eps, or A < 0 and r < 1 - eps) gets exactly zero gradient; beyond it on the other side,
        and inside it, the unclipped term keeps its gradient `-A r w` (PPO's pessimistic min), for ratios up to e^8
        either way. Skipped when the declaration is on-policy only."""
        law = "clipped ratio"
        spec = check_spec(algorithm)
        _skip_unless(spec, law)
        case = replace(case, kl_beta=0.0, ref=case.new)
        at = invariant_precision(spec.loss_dtype)
        weights = _weights(loss_under_test, spec, case, law)
        got = _call(loss_under_test, spec, case, law)
        rounded = got.case
        ignores_old = all(
            abs(got.grad[j][s] + weights[j] * rounded.advantages[j]) <= 1e-3 * abs(weights[j] * rounded.advantages[j])
            for j, s in rounded.tokens()
        ) and any(abs(rounded.new[j][s] - rounded.old[j][s]) > 0.5 for j, s in rounded.tokens())
        on_policy = replace(spec, importance_ratio="on_policy").declared()
        hint = (
            " Every token's gradient is -A w whatever its ratio: the loss ignores old_logp. If stale samples never "
            f"reach it (one PPO epoch, no pipelining), declare {on_policy}."
            if ignores_old
            else ""
        )
        hint += _dual_clip_hint(spec, rounded, weights, got, at)
        for (i, t), token in _tokens(spec, rounded).items():
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
                    f"{law}: {where} is beyond the trust region on the side that raises the objective, so the "
                    f"surrogate is flat and d loss / d new_logp must be 0, got {have!r}: a stale sample's gain is not "
                    f"capped (the ratio is not clipped).{hint}\n({rounded})"
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
        tokens = _tokens(spec, rounded)
        want_value = math.fsum(weights[i] * token.value for (i, _), token in tokens.items())
        tolerance = _value_tolerance(at, weights, tokens)
        assert abs(got.value - want_value) <= tolerance, (
            f"{law}: the loss is {got.value!r}, expected {want_value!r}, the weighted sum of "
            f"-min(r A, clip(r, 1 - eps, 1 + eps) A) (tolerance {tolerance:.3g}).{hint}\n({rounded})"
        )

    @law_settings(max_examples=15)
    @explicit_examples(
        cell(
            [(1.0, [(-1.0, 0.3, 2.0)] * 3), (-0.5, [(-2.0, -0.4, -3.0)]), (2.0, [(-0.5, 0.0, 5.0)] * 5)],
            padding=2,
            kl_beta=0.1,
        ),
    )
    @given(case=loss_batches(log_ratio=LOG_RATIO, kl_beta=st.floats(min_value=0.0, max_value=0.5)))
    def test_loss_ignores_padding_tokens(
        self, loss_under_test: LossUnderTest, algorithm: AlgorithmSpec, case: LossBatch
    ) -> None:
        """Padding (mask 0) changes nothing: other log-probs there leave the loss and every completion token's
        gradient unchanged, and the padding's own gradient is exactly 0 (in the surrogate, the KL and the count
        of tokens alike)."""
        law = "padding"
        spec = check_spec(algorithm)
        case = _fresh(spec, case)
        eps = invariant_precision(spec.loss_dtype).eps
        # Far from the padding's first values: ratios of e^-25 and gaps of 25 nats where nothing may look.
        padded = replace(
            case,
            new=repadded(case.new, case.lengths, -25.0),
            old=repadded(case.old, case.lengths, -0.05),
            ref=repadded(case.ref, case.lengths, -0.01),
        )
        if spec.importance_ratio == "on_policy":
            padded = as_on_policy(padded)
        first = _call(loss_under_test, spec, case, law)
        second = _call(loss_under_test, spec, padded, law)
        for outcome in (first, second):
            for i, length in enumerate(case.lengths):
                leaked = [g for g in outcome.grad[i][length:] if g != 0.0]
                assert not leaked, (
                    f"{law}: completion {i} has {length} tokens, but its padding got gradient "
                    f"{outcome.grad[i][length:]}: the mask is not applied\n({outcome.case})"
                )
        scale = abs(first.value) + abs(second.value) + math.fsum(abs(g) for row in first.grad for g in row)
        assert abs(first.value - second.value) <= TOLERANCE_FACTOR * eps * scale, (
            f"{law}: only the padding's log-probs changed, but the loss went from {first.value!r} to "
            f"{second.value!r}: padding enters the loss (a term or a token count without the mask)\n({padded})"
        )
        for i, t in case.tokens():
            a, b = first.grad[i][t], second.grad[i][t]
            assert abs(a - b) <= TOLERANCE_FACTOR * eps * (abs(a) + abs(b)), (
                f"{law}: only the padding's log-probs changed, but d loss / d new_logp[{i}][{t}] went from {a!r} to "
                f"{b!r}\n({padded})"
            )

    @law_settings(max_examples=15)
    @explicit_examples(
        cell([(10.0, [(-30.0 + 8.0, 8.0, 0.0), (-0.01, -8.0, -8.0), (-20.0, 0.0, 8.0)])], clip_eps=0.4, kl_beta=0.5),
        cell([(-10.0, [(-22.0, 8.0, -8.0)] * 64), (0.0, [(-0.01, -5.0, 5.0)])], clip_eps=0.05, kl_beta=0.5),
    )
    @given(
        case=loss_batches(
            log_ratio=LOG_RATIO,
            kl_beta=st.floats(min_value=0.0, max_value=0.5),
            clip_eps=st.floats(min_value=0.05, max_value=0.4),
            max_length=64,
        )
    )
    def test_loss_is_a_finite_differentiable_scalar(
        self, loss_under_test: LossUnderTest, algorithm: AlgorithmSpec, case: LossBatch
    ) -> None:
        """For log-probs in [-30, 0], ratios up to e^8 either way, reference gaps up to 8 nats, advantages up to 10 in
        size, any clip_eps and kl_beta, in the declared dtype: the loss is a finite 0-d floating tensor, `stats` (if
        returned) a mapping, and backward gives new_logp a finite gradient of its shape (and a per-completion
        `sample_loss` returns a 0-d loss itself)."""
        import torch

        law = "finite differentiable scalar"
        spec = check_spec(algorithm)
        case = _fresh(spec, case)
        dtype = getattr(torch, spec.loss_dtype)
        if loss_under_test.sample_loss is not None:
            row = [
                torch.tensor(getattr(case, name)[0][: case.lengths[0]], dtype=dtype) for name in ("new", "old", "ref")
            ]
            row[0].requires_grad_(True)
            out = loss_under_test.sample_loss(*row, case.advantages[0], clip_eps=case.clip_eps, kl_beta=case.kl_beta)
            assert isinstance(out, tuple) and len(out) == 2, (
                f"{law}: sample_loss returned a {type(out).__name__}, expected a (loss, stats) tuple ({case})"
            )
            loss, stats = out
            assert isinstance(loss, torch.Tensor) and loss.dim() == 0, (
                f"{law}: sample_loss returned a loss of shape {tuple(getattr(loss, 'shape', ()))}, expected a 0-d "
                f"tensor (shape ()), as a mean over tokens without keepdim gives ({case})"
            )
            assert isinstance(stats, Mapping), f"{law}: stats is a {type(stats).__name__}, expected a mapping ({case})"
        new = torch.tensor(case.new, dtype=dtype, requires_grad=True)
        old, ref = torch.tensor(case.old, dtype=dtype), torch.tensor(case.ref, dtype=dtype)
        mask = torch.tensor([[1.0] * n + [0.0] * (case.width - n) for n in case.lengths], dtype=dtype)
        out = loss_under_test.batch_loss(
            new,
            old,
            ref,
            torch.tensor(case.advantages, dtype=dtype),
            mask,
            clip_eps=case.clip_eps,
            kl_beta=case.kl_beta,
        )
        loss = out[0] if isinstance(out, tuple) else out
        if isinstance(out, tuple):
            assert isinstance(out[1], Mapping), f"{law}: stats is a {type(out[1]).__name__}, expected a mapping"
        assert isinstance(loss, torch.Tensor) and loss.dim() == 0, (
            f"{law}: the loss has shape {tuple(getattr(loss, 'shape', ()))}, expected a 0-d tensor ({case})"
        )
        assert loss.is_floating_point() and bool(torch.isfinite(loss)), f"{law}: the loss is {loss!r} ({case})"
        loss.backward()
        grad = new.grad
        assert grad is not None and grad.shape == new.shape, (
            f"{law}: backward gave new_logp the gradient {grad!r}, expected one of shape {tuple(new.shape)} ({case})"
        )
        assert bool(torch.isfinite(grad).all()), f"{law}: d loss / d new_logp = {grad.tolist()} is not finite ({case})"

    # -- choices -------------------------------------------------------------------------------------------------------

    @law_settings(max_examples=15)
    @explicit_examples(
        cell([(1.0, [(-1.0, 0.0, 0.0)]), (1.0, [(-2.0, 0.0, 0.0)] * 7)]),
        cell([(1.5, [(-1.0, 0.0, 0.0)] * 3), (-0.5, [(-3.0, 0.0, 1.0)] * 5), (2.0, [(-0.1, 0.0, 0.0)] * 64)]),
        cell([(-1.0, [(-4.0, 0.0, 0.0)] * 4)], padding=0),
    )
    @given(case=loss_batches(max_length=64))
    def test_loss_aggregates_tokens_as_declared(
        self, loss_under_test: LossUnderTest, algorithm: AlgorithmSpec, case: LossBatch
    ) -> None:
        """At ratio 1 with kl_beta 0, each token's gradient is `-A_i w_i` with the declared aggregation's weight:
        1/(B T_i) for "sequence_mean" (a long completion does not outweigh a short one), 1/(B L) for "constant",
        1/B for "sequence_sum", 1/sum(T) for "token_mean"; a clipped-ratio loss's value is `-sum_i A_i T_i w_i`."""
        law = "declared aggregation"
        spec = check_spec(algorithm)
        case = replace(as_on_policy(case), kl_beta=0.0)
        declared = token_weights(spec, case.lengths)
        got = _call(loss_under_test, spec, case, law)
        wrong = _mismatch(spec, got, declared, precision(spec.loss_dtype))
        if wrong:
            measured = _weights(loss_under_test, spec, case, law)
            candidates = [
                (candidate, token_weights(candidate, case.lengths))
                for candidate in _aggregations(spec, case.lengths, measured)
            ]
            fits = _fits(candidates, spec, got) or (
                f"The loss weighs the tokens of completions of lengths {list(case.lengths)} by {measured}."
            )
            raise AssertionError(
                f"{law}: {wrong}; {spec.declared()} weighs them by {declared} ({spec.loss_aggregation}, at "
                f"{spec.loss_dtype} precision). {fits}\n({got.case})"
            )

    @law_settings(max_examples=15)
    @explicit_examples(*KL_CELLS)
    @given(case=loss_batches(kl_beta=st.floats(min_value=0.01, max_value=0.5)))
    def test_loss_kl_penalty_is_the_declared_estimator(
        self, loss_under_test: LossUnderTest, algorithm: AlgorithmSpec, case: LossBatch
    ) -> None:
        """At ratio 1, each token's loss is `-A + kl_beta k(ref - new)` with the declared estimator (k3:
        `exp(d) - d - 1`; k2: `d^2 / 2`; k3_ratio: k3 times the ratio, whose gradient is k2's at ratio 1) and clamp,
        weighted as the surrogate is, for reference gaps up to 8 nats: value and gradient within the declared dtype's
        tolerance. Skipped when the declaration has no KL penalty."""
        law = "declared KL estimator"
        spec = check_spec(algorithm)
        _skip_unless(spec, law)
        case = as_on_policy(case)
        weights = _weights(loss_under_test, spec, case, law)
        got = _call(loss_under_test, spec, case, law)
        wrong = _mismatch(spec, got, weights, precision(spec.loss_dtype))
        if wrong:
            candidates = [
                (replace(spec, kl_estimator=kl, kl_clamp=clamp, loss_dtype=dtype), weights)
                for kl in _KL_ESTIMATORS
                for clamp in _KL_CLAMPS
                if not (kl == "none" and clamp is not None)
                for dtype in _HINT_DTYPES
            ]
            fits = _fits(candidates, spec, got) or (
                "No declarable estimator matches: the KL term may be weighted differently from the surrogate's "
                f"-A (whose weights are {weights}), e.g. summed over tokens where the surrogate is averaged."
            )
            raise AssertionError(
                f"{law}: {wrong}, for {spec.declared()} ({spec.kl_estimator}, weighted as the surrogate is, at "
                f"{spec.loss_dtype} precision). {fits}\n({got.case})"
            )


_HINT_DTYPES: tuple[LossDtype, ...] = ("float64", "float32")
"""The dtypes a failure suggests declaring: not bfloat16, whose tolerance is wide enough to fit many a bug."""

_KL_ESTIMATORS: tuple[KlEstimator, ...] = ("k3", "k2", "k3_ratio", "none")
_KL_CLAMPS: tuple[float | None, ...] = (None, 10.0)
"""The KL clamps a failure suggests: none, and verl's low_var_kl bound."""
_PER_SEQUENCE: tuple[LossAggregation, ...] = ("sequence_mean", "sequence_sum", "token_mean")


def _aggregations(spec: AlgorithmSpec, lengths: Sequence[int], measured: Sequence[float]) -> list[AlgorithmSpec]:
    """Every declarable aggregation at every suggested dtype, the constant one's L implied by the first measured
    weight."""
    implied = 1.0 / (len(lengths) * measured[0]) if measured[0] > 0 else math.nan
    out = []
    for dtype in _HINT_DTYPES:
        for name in _PER_SEQUENCE:
            out.append(replace(spec, loss_aggregation=name, loss_normalizer=None, loss_dtype=dtype))
        if math.isfinite(implied) and implied > 0:
            out.append(replace(spec, loss_aggregation="constant", loss_normalizer=round(implied, 6), loss_dtype=dtype))
    return out
