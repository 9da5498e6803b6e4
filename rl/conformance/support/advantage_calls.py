"""What the advantage laws share: calling the function under test (`call_advantages`, which keeps groups of one out of a
`singleton_groups="refused"` call), the rounding tolerance of the invariants, and the hints a failure gives (the
declaration the advantages would match, on the failing batch and on fixed probe groups). Pure Python: no torch."""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace

from rl.conformance.algorithm_spec import (
    ADVANTAGE_FIELDS,
    AdvantageBaseline,
    AdvantageDtype,
    AdvantageScale,
    AlgorithmSpec,
    StdEpsPlacement,
    StdScope,
)
from rl.conformance.support.advantage_cases import RewardBatch, interleave
from rl.conformance.support.reference import (
    TOLERANCE_FACTOR,
    advantage_tolerance,
    invariant_precision,
    reference_advantages,
)

__all__ = ["AdvantageFn"]

AdvantageFn = Callable[[Sequence[int], Sequence[float]], Sequence[float]]
"""`(group_ids, rewards) -> advantages`, one per sample in input order, like
`rl.algorithm.advantages.group_normalized_advantages`."""


def call_advantages(advantages: AdvantageFn, batch: RewardBatch, spec: AlgorithmSpec) -> list[float]:
    """The advantages as floats, after checking the one-output-per-input law every other law relies on. Under
    `singleton_groups="refused"` the groups of one are left out of the call (they never occur) and get 0.0."""
    kept = list(range(len(batch.rewards)))
    if spec.singleton_groups == "refused":
        members = batch.members()
        kept = [i for i, gid in enumerate(batch.group_ids) if len(members[gid]) > 1]
    ids, rewards = [batch.group_ids[i] for i in kept], [batch.rewards[i] for i in kept]
    try:
        got = [float(a) for a in advantages(ids, rewards)]
    except Exception as exc:
        members = batch.members()
        if any(len(members[gid]) == 1 for gid in ids):
            refused = replace(spec, singleton_groups="refused").declared(ADVANTAGE_FIELDS)
            raise AssertionError(
                f"{batch} has a group of one and the call raised {type(exc).__name__}: {exc}. If groups of one never "
                f"occur in your trainer, declare {refused}: declare it if that is your design (the laws then never "
                "send one but to check the refusal)."
            ) from exc
        raise
    assert len(got) == len(kept), f"one output per input: {len(kept)} rewards gave {len(got)} advantages ({batch})"
    out = [0.0] * len(batch.rewards)
    for i, a in zip(kept, got, strict=True):
        out[i] = a
    return out


def _spread_scale(group: Sequence[float]) -> float:
    """`max|r| / max|r - mean|`: how many times the spread the rewards' magnitude is (1 for rewards centred on 0)."""
    mean = statistics.fmean(group)
    spread = max(abs(r - mean) for r in group)
    return max(abs(r) for r in group) / spread if spread > 0 else 0.0


def invariant_tolerance(spec: AlgorithmSpec, group: Sequence[float], outputs: Iterable[float]) -> float:
    """How far two advantages of one group may differ by rounding alone, at no finer than float32 resolution, from the
    implementation's own output scale (so that it holds whatever the declared scale): `G * eps * (max|r| / spread)`
    relative to the largest advantage, squared in that advantage for the std's own error."""
    finite = [abs(a) for a in outputs if math.isfinite(a)]
    size = max(finite, default=0.0)
    eps, tiny = invariant_precision(spec.advantage_dtype)
    return TOLERANCE_FACTOR * (eps * len(group) * (_spread_scale(group) + 1.0) * size * (1.0 + size) + tiny)


def same_within(a: float, b: float, tolerance: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b or abs(a - b) <= tolerance


_PROBE = interleave(
    [
        (1, (0.0, 1.0)),
        (2, (0.0, 0.01)),
        (3, (0.0, 0.0, 0.0, 1.0)),
        (4, (1.0,) + (0.0,) * 15),
        (5, (0.1, 0.2, 0.7)),
        (6, (0.5, 0.50001, 0.5)),
    ]
)
"""Groups that tell the declarable scales apart: [0, 1]; a spread of 0.01 (where eps and where it enters dominate);
one success in 4 and in 16 (the sample and population std differ most, and so do the leave-one-out baseline and the
group mean); rewards not exact in binary; a spread of 1e-5, below common eps (where a floor and an added eps differ)."""

_COMMON_EPS = (0.0, 1e-9, 1e-8, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2)
_SCALES: tuple[AdvantageScale, ...] = ("population_std", "sample_std", "none")
_PLACEMENTS: tuple[StdEpsPlacement, ...] = ("std", "variance", "floor")
_DTYPES: tuple[AdvantageDtype, ...] = ("float64", "float32")
_BASELINES: tuple[AdvantageBaseline, ...] = ("group_mean", "leave_one_out")
_SCOPES: tuple[StdScope, ...] = ("group", "batch")
_HINT_FIELDS = ("advantage_baseline", "std_scope", "advantage_scale", "std_eps_placement", "advantage_dtype", "std_eps")


def _candidates(spec: AlgorithmSpec) -> list[AlgorithmSpec]:
    """Every declarable scale, baseline, scope, eps placement, common eps and dtype, fewest fields changed from `spec`
    first, `spec` itself left out (a hint never proposes what is already declared)."""
    out = []
    for baseline, scope, scale, placement, dtype, eps in itertools.product(
        _BASELINES, _SCOPES, _SCALES, _PLACEMENTS, _DTYPES, sorted({spec.std_eps, *_COMMON_EPS})
    ):
        if scale == "none" and (placement != spec.std_eps_placement or eps != spec.std_eps):
            continue
        try:
            candidate = replace(
                spec,
                advantage_baseline=baseline,
                std_scope=scope,
                advantage_scale=scale,
                std_eps_placement=placement,
                advantage_dtype=dtype,
                std_eps=eps,
            )
        except ValueError:
            continue  # an inconsistent combination (a batch scope without a std)
        if candidate != spec:
            out.append(candidate)
    out.sort(key=lambda c: sum(getattr(c, f) != getattr(spec, f) for f in _HINT_FIELDS))
    return out


def _fits_reference(candidate: AlgorithmSpec, batch: RewardBatch, got: Sequence[float]) -> bool:
    """Whether `got` matches `candidate`'s reference on every group of two or more with signal in `batch`."""
    expected = reference_advantages(candidate, batch.group_ids, batch.rewards)
    for gid, idx in batch.members().items():
        group = batch.group(gid)
        if len(group) < 2 or len(set(group)) == 1:
            continue
        for i in idx:
            tolerance = advantage_tolerance(candidate, group, expected[i], batch.rewards)
            if not same_within(got[i], expected[i], tolerance) or math.isnan(got[i]):
                return False
    return True


def matching_declaration(spec: AlgorithmSpec, advantages: AdvantageFn, case: RewardBatch, got: Sequence[float]) -> str:
    """The declaration closest to `spec` (fewest fields changed, never `spec` itself) whose reference the
    implementation's advantages match, both on `_PROBE` and on the failing `case`; "" if none does."""
    probe = call_advantages(advantages, _PROBE, spec)
    for candidate in _candidates(spec):
        if _fits_reference(candidate, case, got) and _fits_reference(candidate, _PROBE, probe):
            return candidate.declared(ADVANTAGE_FIELDS)
    return ""
