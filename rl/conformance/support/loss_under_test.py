"""What every loss law shares: the loss under test in batch form (`sample_loss_as_batch_loss` lifts a per-completion
loss), calling it on a `LossBatch` at the declared dtype, the float64 reference of a call from the declaration
(`mismatch`), and the hints a failure gives (the declaration the loss would match). torch is imported inside the
functions, never at import."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import pytest

from rl.conformance.algorithm_spec import LOSS_FIELDS, AlgorithmSpec, KlEstimator, LossAggregation, LossDtype
from rl.conformance.support.loss_cases import LossBatch, as_on_policy
from rl.conformance.support.reference import (
    TOLERANCE_FACTOR,
    Precision,
    TokenReference,
    precision,
    token_reference,
    token_tolerance,
    token_weights,
)

if TYPE_CHECKING:
    from torch import Tensor

__all__ = ["BatchLossFn", "LossUnderTest", "SampleLossFn", "sample_loss_as_batch_loss"]

SampleLossFn = Callable[..., Any]
"""`(new_logp, old_logp, ref_logp, advantage, clip_eps=0.2, kl_beta=0.03) -> (loss, stats)` on 1-D torch tensors of one
completion, like `rl.algorithm.loss.grpo_sample_loss`."""

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
class LossOutcome:
    """A call's loss and d loss / d new_logp, and the inputs as the declared dtype rounded them (what the reference
    is computed from)."""

    value: float
    grad: list[list[float]]
    case: LossBatch


def call_loss(loss: LossUnderTest, spec: AlgorithmSpec, case: LossBatch, law: str) -> LossOutcome:
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
    return LossOutcome(float(value.detach()), new.grad.double().tolist(), rounded)


def measured_weights(loss: LossUnderTest, spec: AlgorithmSpec, case: LossBatch, law: str) -> list[float]:
    """The implementation's own weight of each completion's tokens: `-d loss / d new_logp` at ratio 1, advantage 1
    and kl_beta 0 (where the per-token loss is -r A), on the batch's shape; the declared weights where that is 0 or
    not finite (so that a loss with no usable gradient is still compared with something)."""
    probe = replace(case, old=case.new, ref=case.new, advantages=(1.0,) * len(case.lengths), kl_beta=0.0)
    grad = call_loss(loss, spec, probe, law).grad
    measured = [-grad[i][0] for i in range(len(case.lengths))]
    if all(math.isfinite(w) and w != 0.0 for w in measured):
        return measured
    return token_weights(spec, case.lengths)


def token_references(spec: AlgorithmSpec, case: LossBatch) -> dict[tuple[int, int], TokenReference]:
    """Each unmasked token's reference; under `importance_ratio="sequence"` with its completion's mean log ratio."""
    log_ratios: dict[int, float | None] = {}
    for i, length in enumerate(case.lengths):
        mean = math.fsum(case.new[i][t] - case.old[i][t] for t in range(length)) / length
        log_ratios[i] = mean if spec.importance_ratio == "sequence" else None
    return {
        (i, t): token_reference(
            spec,
            case.new[i][t],
            case.old[i][t],
            case.ref[i][t],
            case.advantages[i],
            case.clip_eps,
            case.kl_beta,
            log_ratio=log_ratios[i],
        )
        for i, t in case.tokens()
    }


def kl_weights(spec: AlgorithmSpec, lengths: Sequence[int], weights: Sequence[float]) -> list[float]:
    """The KL term's weight of each completion's tokens: the surrogate's `weights` (the loss's own, measured), times
    the declared `kl_aggregation`'s weight over the declared `loss_aggregation`'s (1 when it declares none)."""
    if spec.kl_aggregation is None:
        return list(weights)
    kl_spec = replace(spec, loss_aggregation=spec.kl_aggregation, loss_normalizer=None, kl_aggregation=None)
    declared, kl_declared = token_weights(spec, lengths), token_weights(kl_spec, lengths)
    return [w * k / d for w, k, d in zip(weights, kl_declared, declared, strict=True)]


def _compares_value(spec: AlgorithmSpec) -> bool:
    """Whether the declared loss's value is the reference's (not a convention: on-policy, CISPO's `A new`)."""
    return spec.importance_ratio in ("clipped", "sequence")


def value_tolerance(
    at: Precision,
    weights: Sequence[float],
    tokens: Mapping[tuple[int, int], TokenReference],
    kl: Sequence[float] | None = None,
) -> float:
    """The sum over tokens of each weighted term's tolerance, plus a naive sum's rounding over that many terms."""
    kl = weights if kl is None else kl
    per_token = [token_tolerance(at, max(abs(weights[i]), abs(kl[i])), token) for (i, _), token in tokens.items()]
    absolute = math.fsum(abs(_weighted(weights, kl, i, token, "value")) for (i, _), token in tokens.items())
    return math.fsum(per_token) + TOLERANCE_FACTOR * at.eps * len(tokens) * absolute


def _weighted(weights: Sequence[float], kl: Sequence[float], i: int, token: TokenReference, what: str) -> float:
    """Token `(i, .)`'s weighted value or gradient: the surrogate part by `weights[i]`, the KL part by `kl[i]`."""
    total, kl_part = (token.value, token.kl_value) if what == "value" else (token.grad, token.kl_grad)
    return weights[i] * (total - kl_part) + kl[i] * kl_part


def weighted_value(spec: AlgorithmSpec, case: LossBatch, weights: Sequence[float]) -> float:
    """The reference loss of `case` with the surrogate weighted by `weights` and the KL as declared."""
    kl = kl_weights(spec, case.lengths, weights)
    return math.fsum(
        _weighted(weights, kl, i, token, "value") for (i, _), token in token_references(spec, case).items()
    )


def kl_part(got: LossOutcome, without: LossOutcome) -> LossOutcome:
    """The KL term's own share of `got`: its value and gradient less those of the same call with kl_beta 0
    (`without`), so that the KL laws see the KL term whatever surrogate or importance ratio the loss has."""
    return replace(
        got,
        value=got.value - without.value,
        grad=[[a - b for a, b in zip(ra, rb, strict=True)] for ra, rb in zip(got.grad, without.grad, strict=True)],
    )


def mismatch(
    spec: AlgorithmSpec, got: LossOutcome, weights: Sequence[float], at: Precision, *, kl_only: bool = False
) -> str:
    """Where the outcome's gradient (and, for a loss whose value is not a convention, its value) differs from the
    reference of `spec` weighted by `weights` (the KL part by `kl_weights`), token by token, beyond the tolerance
    precision `at` earns; "" where it does not. With `kl_only`, `got` is a `kl_part` and only the reference's KL part
    is compared (its value always: a KL term's value is no convention)."""
    case = got.case
    tokens = token_references(spec, case)
    kl = kl_weights(spec, case.lengths, weights)
    if kl_only:
        tokens = {key: replace(token, value=token.kl_value, grad=token.kl_grad) for key, token in tokens.items()}
    for (i, t), token in tokens.items():
        want, have = _weighted(weights, kl, i, token, "grad"), got.grad[i][t]
        tolerance = token_tolerance(at, max(abs(weights[i]), abs(kl[i])), token)
        if not abs(have - want) <= tolerance:
            parts = f"weight {weights[i]!r} x {token.grad - token.kl_grad!r}"
            if token.kl_grad:
                parts += f" + KL weight {kl[i]!r} x {token.kl_grad!r}"
            return (
                f"d loss / d new_logp[{i}][{t}] is {have!r}, expected {want!r} ({parts}; tolerance {tolerance:.3g}; "
                f"ratio {token.ratio!r}, advantage {case.advantages[i]!r}, ref - new "
                f"{case.ref[i][t] - case.new[i][t]!r})"
            )
    if kl_only or _compares_value(spec):
        want_value = math.fsum(_weighted(weights, kl, i, token, "value") for (i, _), token in tokens.items())
        tolerance = value_tolerance(at, weights, tokens, kl)
        if not abs(got.value - want_value) <= tolerance:
            return (
                f"the loss is {got.value!r}, expected {want_value!r} (the weighted sum of the tokens' losses; "
                f"tolerance {tolerance:.3g})"
            )
    return ""


def matching_declaration(
    candidates: Sequence[tuple[AlgorithmSpec, Sequence[float]]],
    declared: AlgorithmSpec,
    got: LossOutcome,
    *,
    kl_only: bool = False,
    also: Sequence[tuple[LossOutcome, Sequence[float]]] = (),
) -> str:
    """The first candidate declaration (other than `declared`, fewest fields changed first) whose reference, with its
    weights and at its dtype's precision, the outcome matches (and each outcome of `also`, with its weights: a hint
    must hold beyond the one failing call): a sentence saying to declare it, or ""."""
    ranked = sorted(
        candidates, key=lambda c: sum(a != b for a, b in zip(_values(c[0]), _values(declared), strict=True))
    )
    for candidate, weights in ranked:
        at = precision(candidate.loss_dtype)
        if (
            candidate != declared
            and not mismatch(candidate, got, weights, at, kl_only=kl_only)
            and not any(mismatch(candidate, other, w, at, kl_only=kl_only) for other, w in also)
        ):
            return f"The loss matches {candidate.declared(LOSS_FIELDS)}: declare it if that is your design."
    return ""


def _values(spec: AlgorithmSpec) -> tuple[Any, ...]:
    return tuple(getattr(spec, name) for name in LOSS_FIELDS)


def skip_unless(spec: AlgorithmSpec, law: str) -> None:
    if law in _NEEDS_KL and spec.kl_estimator == "none":
        pytest.skip(
            f"{spec.declared(LOSS_FIELDS)} declares no KL penalty (the laws pass kl_beta=0.0), so this law does not "
            "apply"
        )
    if law in _NEEDS_CLIP and spec.importance_ratio == "on_policy":
        pytest.skip(
            f"{spec.declared(LOSS_FIELDS)} declares an on-policy loss (the laws pass old_logp = new_logp), so no "
            "stale sample reaches it and this law does not apply"
        )


_NEEDS_KL = {"KL penalty", "declared KL estimator"}
_NEEDS_CLIP = {"clipped ratio"}


def _kl_beta(spec: AlgorithmSpec, beta: float) -> float:
    return 0.0 if spec.kl_estimator == "none" else beta


def fresh(spec: AlgorithmSpec, case: LossBatch) -> LossBatch:
    """`case` with old_logp = new_logp when the declared loss is on-policy only, and kl_beta 0 when it has no KL."""
    case = replace(case, kl_beta=_kl_beta(spec, case.kl_beta))
    return as_on_policy(case) if spec.importance_ratio == "on_policy" else case


def dual_clip_hint(
    spec: AlgorithmSpec, case: LossBatch, weights: Sequence[float], got: LossOutcome, at: Precision
) -> str:
    """When tokens with A < 0 and a ratio above 1 get zero gradient and no dual clip is declared: the c whose dual clip
    explains the loss's value and every gradient (one unknown: the value is linear in c), as a declaration to make,
    or "" when none does."""
    if spec.dual_clip is not None:
        return ""
    tokens = token_references(spec, case)
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
    for (i, t), token in token_references(candidate, case).items():
        want = weights[i] * token.grad
        if abs(got.grad[i][t] - want) > token_tolerance(at, weights[i], token) + 1e-6 * abs(want):
            return ""
    return (
        f" Tokens with A < 0 and a ratio above {c!r} are flat: a dual clip (verl's clip_ratio_c). The loss matches "
        f"{candidate.declared(LOSS_FIELDS)}: declare it if that is your design."
    )


HINT_DTYPES: tuple[LossDtype, ...] = ("float64", "float32")
"""The dtypes a failure suggests declaring: not bfloat16, whose tolerance is wide enough to fit many a bug."""

KL_ESTIMATORS: tuple[KlEstimator, ...] = ("k3", "k2", "k3_ratio", "k3_value_k2_grad", "none")
KL_AGGREGATIONS: tuple[LossAggregation | None, ...] = (None, "sequence_mean", "sequence_sum", "token_mean")
KL_CLAMPS: tuple[float | None, ...] = (None, 10.0)
"""The KL clamps a failure suggests: none, and verl's low_var_kl bound."""
_PER_SEQUENCE: tuple[LossAggregation, ...] = ("sequence_mean", "sequence_sum", "token_mean")


def implied_normalizer(lengths: Sequence[int], measured: Sequence[float]) -> float:
    """The L of "constant" that the first measured weight implies, `1 / (B w_0)`; NaN if it implies none (unequal
    weights, or a weight that is not positive)."""
    if not measured[0] > 0 or any(abs(w - measured[0]) > 1e-9 * measured[0] for w in measured):
        return math.nan
    return 1.0 / (len(lengths) * measured[0])


def aggregations(spec: AlgorithmSpec, implied: float) -> list[AlgorithmSpec]:
    """Every declarable aggregation at every suggested dtype, the constant one with `implied` as its L (none when
    `implied` is NaN: the weights imply no constant that holds beyond one batch), each also with CISPO's value
    convention (whose value is not compared: at ratio 1 any ratio_cap fits)."""
    out = []
    for dtype in HINT_DTYPES:
        for name in _PER_SEQUENCE:
            out.append(replace(spec, loss_aggregation=name, loss_normalizer=None, loss_dtype=dtype))
        if math.isfinite(implied) and implied > 0:
            out.append(replace(spec, loss_aggregation="constant", loss_normalizer=round(implied, 6), loss_dtype=dtype))
    conventions = []
    if spec.importance_ratio in ("clipped", "sequence"):
        for candidate in out:
            try:
                conventions.append(replace(candidate, importance_ratio="cispo", ratio_cap=5.0))
            except ValueError:
                continue  # not declarable with the rest of `candidate`
    return out + conventions
