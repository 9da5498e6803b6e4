"""The loss laws: GRPO's clipped-ratio loss with its KL penalty, checked on a padded batch as a trainer calls it.

Subclass `LossContract` and provide `batch_loss`, `(new_logp, old_logp, ref_logp, advantages, mask, *, clip_eps,
kl_beta) -> loss` or `(loss, stats)` on `[B, T]` log-probs, `[B]` advantages and a `[B, T]` mask (1.0 on tokens, 0.0
on padding), as TRL-style trainers do; or a per-completion `sample_loss` like `rl.algorithm.loss.grpo_sample_loss`,
which `sample_loss_as_batch_loss` lifts to that form (each row's unmasked tokens, then the mean over rows). Provide the
`algorithm` fixture when your choices differ from ours. Invariants hold for every declaration (REINFORCE at ratio 1, a
non-negative KL that pulls towards the reference, the clip, padding, a finite scalar); choice laws compare to the
float64 reference of the declaration (`rl.conformance.support.reference`) at its dtype's tolerance, each dividing out
the loss's own per-token weight but the aggregation law. Hazardous cells run first as explicit examples. torch is
imported inside the laws, never at import. An example subclass and every law: docs/conformance.md
(#the-other-way-in-subclass-the-contracts, #declaring-your-choices-algorithmspec).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rl.conformance.algorithm_spec import LOSS_FIELDS, AlgorithmSpec, check_spec
from rl.conformance.loss_kl_laws import LossKlLaws
from rl.conformance.loss_ratio_laws import LossRatioLaws
from rl.conformance.support.contract_base import ContractBase, explicit_examples, law_settings, must_provide, tier
from rl.conformance.support.loss_cases import LOG_RATIO, LossBatch, as_on_policy, cell, loss_batches, repadded
from rl.conformance.support.loss_under_test import (
    BatchLossFn,
    LossUnderTest,
    SampleLossFn,
    aggregations,
    call_loss,
    fresh,
    implied_normalizer,
    matching_declaration,
    measured_weights,
    mismatch,
    sample_loss_as_batch_loss,
)
from rl.conformance.support.reference import TOLERANCE_FACTOR, invariant_precision, precision, token_weights

__all__ = ["BatchLossFn", "LossContract", "SampleLossFn", "sample_loss_as_batch_loss"]

_OTHER_SHAPE = cell([(1.0, [(-1.0, 0.0, 0.0)] * 3), (1.0, [(-2.0, 0.0, 0.0)] * 11), (1.0, [(-0.5, 0.0, 0.0)] * 6)])
"""A second batch shape (3 completions of 3, 11 and 6 tokens) on which a proposed constant normaliser must hold too."""


@tier("loss")
class LossContract(LossRatioLaws, LossKlLaws, ContractBase):
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
        """Return the per-completion loss, with the signature of `rl.algorithm.loss.grpo_sample_loss`:
        `(new_logp, old_logp, ref_logp, advantage, clip_eps=0.2, kl_beta=0.03) -> (loss, stats)`, the tensors 1-D of
        one length, `loss` a 0-d tensor differentiable w.r.t. `new_logp`, `stats` a mapping of floats; or provide
        `batch_loss` instead."""
        raise must_provide(
            "LossContract",
            "sample_loss",
            "a callable (new_logp, old_logp, ref_logp, advantage, clip_eps=0.2, kl_beta=0.03) -> (loss, stats) "
            "like rl.algorithm.loss.grpo_sample_loss (or provide `batch_loss` instead)",
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
                "kl_beta) -> loss, or per completion like rl.algorithm.loss.grpo_sample_loss",
            ) from None
        if "token_mean" in (spec.loss_aggregation, spec.kl_aggregation):
            raise ValueError(
                f"{spec.declared(LOSS_FIELDS)} normalises over the batch's tokens, which a per-completion "
                "`sample_loss` cannot express: provide `batch_loss`, or declare the aggregation your sample_loss has"
            )
        return LossUnderTest(sample_loss_as_batch_loss(sample), sample)

    # -- invariants: padding and shape (the ratio laws are in loss_laws_ratio, the KL laws in loss_laws_kl) ---------

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
        case = fresh(spec, case)
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
        first = call_loss(loss_under_test, spec, case, law)
        second = call_loss(loss_under_test, spec, padded, law)
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
        case = fresh(spec, case)
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
        got = call_loss(loss_under_test, spec, case, law)
        wrong = mismatch(spec, got, declared, precision(spec.loss_dtype))
        if wrong:
            measured = measured_weights(loss_under_test, spec, case, law)
            implied = implied_normalizer(case.lengths, measured)
            elsewhere = implied_normalizer(
                _OTHER_SHAPE.lengths, measured_weights(loss_under_test, spec, _OTHER_SHAPE, law)
            )
            stable = math.isfinite(implied) and abs(implied - elsewhere) <= 1e-6 * implied
            candidates = [
                (candidate, token_weights(candidate, case.lengths))
                for candidate in aggregations(spec, implied if stable else math.nan)
            ]
            fits = matching_declaration(candidates, spec, got) or (
                f"The loss weighs the tokens of completions of lengths {list(case.lengths)} by {measured}."
            )
            if math.isfinite(implied) and not stable:
                fits += (
                    f" One weight for every token is a constant normaliser's, but it implies L = {implied!r} here and "
                    f"{elsewhere!r} on completions of lengths {list(_OTHER_SHAPE.lengths)}: a normaliser that depends "
                    "on the batch (its longest completion, its token count), which no loss_normalizer declares."
                )
            raise AssertionError(
                f"{law}: {wrong}; {spec.declared(LOSS_FIELDS)} weighs them by {declared} ({spec.loss_aggregation}, at "
                f"{spec.loss_dtype} precision). {fits}\n({got.case})"
            )
