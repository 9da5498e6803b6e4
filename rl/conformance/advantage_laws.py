"""The advantage laws: GRPO's group-relative advantages, checked as a function `(group_ids, rewards) -> advantages`.

Subclass the contract and provide its fixture (and, when your choices differ from ours, the `algorithm` fixture):

    class TestMyAdvantages(AdvantageContract):
        @pytest.fixture
        def advantages(self):
            return my_group_advantages  # (group_ids, rewards) -> list[float]

        @pytest.fixture
        def algorithm(self):
            return AlgorithmSpec(advantage_scale="sample_std", std_eps=1e-6)

Two kinds of law. An invariant holds for every GRPO variant whatever it declares (a no-signal group gives exact zeros;
centred; ranked as the rewards; order, labels and other groups do not matter). A choice law compares to the float64
reference computed from the declaration (`rl.conformance.reference`) at the declared dtype's tolerance (the scale,
its eps and where eps enters; the singleton convention), and says which declaration the values would match. The
hazardous cells (all-equal groups of rewards that are not exact in binary, at every group size from 2 to 64; large
magnitudes; tiny spreads) are explicit examples, run before anything is drawn. Pure Python: no torch import.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace

import pytest
from hypothesis import given

from rl.conformance._base import ContractBase, explicit_examples, law_settings, must_provide, tier
from rl.conformance.advantage_cases import (
    HAZARDOUS_EQUAL_REWARDS,
    SIGNAL_CELLS,
    SILENT,
    RewardBatch,
    all_equal_cell,
    all_equal_sweep,
    batches_and_one_group,
    interleave,
    permuted_batches,
    relabelled_batches,
    reward_batches,
    with_a_silent_group,
)
from rl.conformance.reference import (
    TOLERANCE_FACTOR,
    advantage_denominator,
    advantage_tolerance,
    invariant_precision,
    reference_advantages,
    singleton_advantage,
)
from rl.conformance.spec import AdvantageDtype, AdvantageScale, AlgorithmSpec, StdEpsPlacement, check_spec

__all__ = ["AdvantageContract", "AdvantageFn"]

AdvantageFn = Callable[[Sequence[int], Sequence[float]], Sequence[float]]
"""`(group_ids, rewards) -> advantages`, one per sample in input order, like
`rl.advantages.group_normalized_advantages`."""


def _call(advantages: AdvantageFn, batch: RewardBatch) -> list[float]:
    """The advantages as floats, after checking the one-output-per-input law every other law relies on."""
    out = [float(a) for a in advantages(list(batch.group_ids), list(batch.rewards))]
    assert len(out) == len(batch.rewards), (
        f"one output per input: {len(batch.rewards)} rewards gave {len(out)} advantages ({batch})"
    )
    return out


def _spread_scale(group: Sequence[float]) -> float:
    """`max|r| / max|r - mean|`: how many times the spread the rewards' magnitude is (1 for rewards centred on 0)."""
    mean = statistics.fmean(group)
    spread = max(abs(r - mean) for r in group)
    return max(abs(r) for r in group) / spread if spread > 0 else 0.0


def _invariant_tolerance(spec: AlgorithmSpec, group: Sequence[float], outputs: Iterable[float]) -> float:
    """How far two advantages of one group may differ by rounding alone, at no finer than float32 resolution, from the
    implementation's own output scale (so that it holds whatever the declared scale): `G * eps * (max|r| / spread)`
    relative to the largest advantage, squared in that advantage for the std's own error."""
    finite = [abs(a) for a in outputs if math.isfinite(a)]
    size = max(finite, default=0.0)
    eps, tiny = invariant_precision(spec.advantage_dtype)
    return TOLERANCE_FACTOR * (eps * len(group) * (_spread_scale(group) + 1.0) * size * (1.0 + size) + tiny)


def _same(a: float, b: float, tolerance: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b or abs(a - b) <= tolerance


_PROBE = interleave(
    [(1, (0.0, 1.0)), (2, (0.0, 0.01)), (3, (0.0, 0.0, 0.0, 1.0)), (4, (1.0,) + (0.0,) * 15), (5, (0.1, 0.2, 0.7))]
)
"""Groups that tell the declarable scales apart: [0, 1]; a spread of 0.01 (where eps and where it enters dominate);
one success in 4 and in 16 (the sample and population std differ most); rewards not exact in binary."""

_COMMON_EPS = (0.0, 1e-9, 1e-8, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2)
_SCALES: tuple[AdvantageScale, ...] = ("population_std", "sample_std", "none")
_PLACEMENTS: tuple[StdEpsPlacement, ...] = ("std", "variance")
_DTYPES: tuple[AdvantageDtype, ...] = ("float64", "float32")


def _matching_declaration(spec: AlgorithmSpec, advantages: AdvantageFn) -> str:
    """The declaration closest to `spec` (fewest fields changed) whose reference the implementation's advantages of
    `_PROBE` match, over the scale, where eps enters, common eps values and the dtype; "" if none does."""
    got = _call(advantages, _PROBE)
    candidates = [
        replace(spec, advantage_scale=scale, std_eps_placement=placement, advantage_dtype=dtype, std_eps=eps)
        for scale, placement, dtype, eps in itertools.product(
            _SCALES, _PLACEMENTS, _DTYPES, sorted({spec.std_eps, *_COMMON_EPS})
        )
        if not (scale == "none" and (placement != spec.std_eps_placement or eps != spec.std_eps))
    ]
    fields = ("advantage_scale", "std_eps_placement", "advantage_dtype", "std_eps")
    candidates.sort(key=lambda c: sum(getattr(c, f) != getattr(spec, f) for f in fields))
    members = _PROBE.members()
    for candidate in candidates:
        expected = reference_advantages(candidate, _PROBE.group_ids, _PROBE.rewards)
        if all(
            _same(got[i], expected[i], advantage_tolerance(candidate, _PROBE.group(gid), expected[i]))
            for gid, idx in members.items()
            for i in idx
        ):
            return candidate.declared()
    return ""


def _reference_of(spec: AlgorithmSpec, batch: RewardBatch, gid: int) -> list[float]:
    return reference_advantages(spec, [gid] * len(batch.group(gid)), batch.group(gid))


@tier("advantages")
class AdvantageContract(ContractBase):
    """Laws of GRPO's group-relative advantage `A_i = (r_i - mean(r_g)) / D_g` (DeepSeekMath §4.1.2) with the scale
    `D_g` the `algorithm` fixture declares: exact zeros for an all-equal group, centred, ranked as the rewards, and no
    dependence on sample order, group labels or other groups, whatever the declaration."""

    @pytest.fixture
    def advantages(self) -> AdvantageFn:
        """Return the function under test: `(group_ids, rewards) -> list[float]`, one advantage per sample in input
        order, like `rl.advantages.group_normalized_advantages`."""
        raise must_provide(
            "AdvantageContract",
            "advantages",
            "a callable (group_ids, rewards) -> list[float] like rl.advantages.group_normalized_advantages",
        )

    @pytest.fixture
    def algorithm(self) -> AlgorithmSpec:
        """Return the `rl.conformance.AlgorithmSpec` your implementation follows; the default is ours."""
        return AlgorithmSpec()

    # -- invariants ----------------------------------------------------------------------------------------------------

    @law_settings(max_examples=15)
    @explicit_examples(*map(all_equal_sweep, HAZARDOUS_EQUAL_REWARDS))
    @given(case=with_a_silent_group())
    def test_advantages_of_an_all_equal_group_are_exactly_zero(
        self, advantages: AdvantageFn, algorithm: AlgorithmSpec, case: RewardBatch
    ) -> None:
        """A group of two or more whose rewards are all equal carries no signal: each member gets exactly 0.0, never
        NaN, inf, a rounding residue like 1e-13 (which a trainer's `advantage == 0` skip misses) or the same-sign
        advantages a float32 mean divided by a near-zero std gives, whatever the declaration and the other groups."""
        check_spec(algorithm)
        got = _call(advantages, case)
        for gid, idx in case.members().items():
            group = case.group(gid)
            if len(group) < 2 or len(set(group)) > 1:
                continue
            out = [got[i] for i in idx]
            where = f"group {gid} = [{group[0]!r}] * {len(group)} (in {case})"
            assert all(math.isfinite(a) for a in out), (
                f"no-signal group: {where} gave {out}: NaN/inf is 0/0 (or x/0) from dividing by its zero std without "
                "eps (or with eps=0); an all-equal group must give exactly 0.0"
            )
            if all(a == 0.0 for a in out):
                continue
            signs = {math.copysign(1.0, a) for a in out if a != 0.0}
            largest = max(abs(a) for a in out)
            why = (
                "its float mean differs from the rewards by rounding, and that residue divided by a std that is itself "
                "rounding noise (float32 accumulation) gives large same-sign advantages: every member pushed the same "
                "way by a prompt that taught nothing"
                if largest > 1e-6 and len(signs) == 1
                else "a rounding residue: the float mean of equal rewards can differ from them, and the residue "
                "divided by eps is not 0, so a trainer's `advantage == 0.0` skip never fires"
            )
            raise AssertionError(
                f"no-signal group: {where} gave {out[:8]}{' ...' if len(out) > 8 else ''}, not exactly 0.0: {why}. "
                "Return exact zeros for a group whose rewards are all equal (check equality before normalising)"
            )

    @law_settings(max_examples=15)
    @explicit_examples(*SIGNAL_CELLS)
    @given(case=reward_batches(silent=True))
    def test_advantages_sum_to_zero_within_each_group(
        self, advantages: AdvantageFn, algorithm: AlgorithmSpec, case: RewardBatch
    ) -> None:
        """Within every group of two or more with signal the advantages sum to zero up to rounding: each is centred on
        its group's mean, not on zero or on the batch mean (every declarable scale centres)."""
        check_spec(algorithm)
        got = _call(advantages, case)
        for gid, idx in case.members().items():
            group = case.group(gid)
            if len(group) < 2 or len(set(group)) == 1:
                continue
            out = [got[i] for i in idx]
            total = math.fsum(out)
            tolerance = len(group) * _invariant_tolerance(algorithm, group, out)
            assert abs(total) <= tolerance, (
                f"zero mean: group {gid} with rewards {group} got advantages {out}, which sum to {total!r} "
                f"(tolerance {tolerance:.3g}) in {case}: they are not centred on the group's mean"
            )

    @law_settings(max_examples=15)
    @explicit_examples(*SIGNAL_CELLS)
    @given(case=reward_batches(silent=True, singletons=True))
    def test_advantages_rank_samples_as_their_rewards_do(
        self, advantages: AdvantageFn, algorithm: AlgorithmSpec, case: RewardBatch
    ) -> None:
        """Within a group, a higher reward gets a strictly higher advantage (where the declared dtype can tell the two
        rewards apart): a better completion is never pushed down relative to a worse one of the same prompt."""
        eps = invariant_precision(check_spec(algorithm).advantage_dtype).eps
        got = _call(advantages, case)
        for gid, idx in case.members().items():
            group = case.group(gid)
            resolution = TOLERANCE_FACTOR * 2 * len(group) * eps * max(abs(r) for r in group)
            by_reward = sorted(zip(group, (got[i] for i in idx), strict=True))
            for (low_r, low_a), (high_r, high_a) in itertools.pairwise(by_reward):
                if high_r - low_r <= resolution:
                    continue
                assert high_a > low_a, (
                    f"rank: in group {gid} with rewards {group}, reward {high_r!r} got advantage {high_a!r} and the "
                    f"lower reward {low_r!r} got {low_a!r} ({case}): advantages must rise with the reward (a sign "
                    "flipped, or a scale that is not positive)"
                )

    @law_settings(max_examples=15)
    @explicit_examples(
        (SIGNAL_CELLS[-1], (0, 3, 6, 1, 4, 7, 2, 5, 8)), (all_equal_cell(0.1, 5), tuple(range(10))[::-1])
    )
    @given(case=permuted_batches())
    def test_advantages_permuting_samples_permutes_advantages(
        self, advantages: AdvantageFn, algorithm: AlgorithmSpec, case: tuple[RewardBatch, tuple[int, ...]]
    ) -> None:
        """Reordering the samples (ids and rewards together) reorders the advantages the same way: an advantage
        depends on its group's rewards, not on where the group's samples sit (they need not be contiguous)."""
        check_spec(algorithm)
        batch, order = case
        got = _call(advantages, batch)
        moved = RewardBatch(tuple(batch.group_ids[i] for i in order), tuple(batch.rewards[i] for i in order))
        permuted = _call(advantages, moved)
        members = batch.members()
        for k, i in enumerate(order):
            gid = batch.group_ids[i]
            tolerance = _invariant_tolerance(algorithm, batch.group(gid), [got[j] for j in members[gid]])
            assert _same(permuted[k], got[i], tolerance), (
                f"permutation equivariance: sample {i} (group {gid}, reward {batch.rewards[i]!r}) has advantage "
                f"{got[i]!r} in {batch}, but {permuted[k]!r} once moved to position {k} by the permutation "
                f"{list(order)}"
            )

    @law_settings(max_examples=15)
    @explicit_examples((interleave([(9, (0.0, 1.0)), (2, (0.0, 0.5, 1.0))]), (1, 7)))
    @given(case=relabelled_batches())
    def test_advantages_relabelling_group_ids_changes_nothing(
        self, advantages: AdvantageFn, algorithm: AlgorithmSpec, case: tuple[RewardBatch, tuple[int, ...]]
    ) -> None:
        """Renaming the groups (any bijection of ids onto other ids) leaves every advantage unchanged: only which
        samples share an id matters, not its value or its order among the ids."""
        check_spec(algorithm)
        batch, new_labels = case
        rename = dict(zip(batch.members(), new_labels, strict=True))
        got = _call(advantages, batch)
        renamed = RewardBatch(tuple(rename[gid] for gid in batch.group_ids), batch.rewards)
        relabelled = _call(advantages, renamed)
        members = batch.members()
        for i, (a, b) in enumerate(zip(got, relabelled, strict=True)):
            gid = batch.group_ids[i]
            tolerance = _invariant_tolerance(algorithm, batch.group(gid), [got[j] for j in members[gid]])
            assert _same(a, b, tolerance), (
                f"relabelling: sample {i} (reward {batch.rewards[i]!r}) has advantage {a!r} with "
                f"group_ids={list(batch.group_ids)} and {b!r} with group_ids={list(renamed.group_ids)} (the renaming "
                f"{rename}); rewards={list(batch.rewards)}"
            )

    @law_settings(max_examples=15)
    @explicit_examples((SIGNAL_CELLS[-1], 5), (all_equal_cell(0.1, 16), SILENT))
    @given(case=batches_and_one_group())
    def test_advantages_of_a_group_do_not_depend_on_other_groups(
        self, advantages: AdvantageFn, algorithm: AlgorithmSpec, case: tuple[RewardBatch, int]
    ) -> None:
        """A group's advantages are a function of its own rewards: changing every other group's rewards
        (r -> 3r + 1) leaves them unchanged (no batch mean, no batch std)."""
        check_spec(algorithm)
        batch, target = case
        changed = RewardBatch(
            batch.group_ids,
            tuple(r if gid == target else 3 * r + 1 for gid, r in zip(batch.group_ids, batch.rewards, strict=True)),
        )
        before = _call(advantages, batch)
        after = _call(advantages, changed)
        idx = batch.members()[target]
        tolerance = _invariant_tolerance(algorithm, batch.group(target), [before[i] for i in idx])
        for i in idx:
            assert _same(before[i], after[i], tolerance), (
                f"independent groups: sample {i} of group {target} (reward {batch.rewards[i]!r}) has advantage "
                f"{before[i]!r} in {batch}, but {after[i]!r} once only the other groups' rewards changed to "
                f"{list(changed.rewards)}"
            )

    # -- choices -------------------------------------------------------------------------------------------------------

    @law_settings(max_examples=15)
    @explicit_examples(*SIGNAL_CELLS)
    @given(case=reward_batches())
    def test_advantages_scale_as_declared(
        self, advantages: AdvantageFn, algorithm: AlgorithmSpec, case: RewardBatch
    ) -> None:
        """Every group of two or more with signal gets the declared `(r - mean) / D_g` (population or sample std or
        none, the declared eps where it enters) within the declared dtype's tolerance. The group [0, 1] thus gets
        ±0.5 / (0.5 + 1e-4) by default (the sample std, 0.7071, would give ±0.7070)."""
        spec = check_spec(algorithm)
        got = _call(advantages, case)
        for gid, idx in case.members().items():
            group = case.group(gid)
            if len(group) < 2 or len(set(group)) == 1:
                continue
            expected = _reference_of(spec, case, gid)
            out = [got[i] for i in idx]
            for r, a, want in zip(group, out, expected, strict=True):
                tolerance = advantage_tolerance(spec, group, want)
                if _same(a, want, tolerance) and not math.isnan(a):
                    continue
                mean = statistics.fmean(group)
                implied = (r - mean) / a if a and math.isfinite(a) else math.nan
                fits = _matching_declaration(spec, advantages)
                raise AssertionError(
                    f"declared scale: group {gid} with rewards {group} got advantages {out}; reward {r!r} has "
                    f"{a!r}, but {spec.declared()} gives (r - mean) / {advantage_denominator(spec, group)!r} = "
                    f"{want!r} (tolerance {tolerance:.3g} for {spec.advantage_dtype}); the values divide by "
                    f"{implied!r} (population std {statistics.pstdev(group)!r}, sample std "
                    f"{statistics.stdev(group)!r}). "
                    + (
                        f"They match {fits}: declare it if that is your design."
                        if fits
                        else "No declarable scale, eps or dtype matches them."
                    )
                )

    @law_settings(max_examples=15)
    @explicit_examples(
        RewardBatch((1, 2, 3, 4, 5, 6, 7, 7), (0.0, 1.0, 0.1, -2.3, 1e6 + 0.1, 1 / 3, 0.0, 1.0)),
        RewardBatch((4,), (0.7,)),
    )
    @given(case=reward_batches(singletons=True, signal=True))
    def test_advantages_of_a_singleton_group_follow_the_declared_convention(
        self, advantages: AdvantageFn, algorithm: AlgorithmSpec, case: RewardBatch
    ) -> None:
        """A group of one sample has nothing to be compared with; it gets the declared convention: exactly 0.0
        ("zero", a no-signal group a trainer skips), or its reward scaled as if mean 0 and std 1 ("reward")."""
        spec = check_spec(algorithm)
        got = _call(advantages, case)
        for gid, idx in case.members().items():
            if len(idx) != 1:
                continue
            (i,) = idx
            r, a, want = case.rewards[i], got[i], singleton_advantage(spec, case.rewards[i])
            ok = a == 0.0 if spec.singleton_groups == "zero" else _same(a, want, advantage_tolerance(spec, [r], want))
            if ok:
                continue
            other = replace(spec, singleton_groups="reward" if spec.singleton_groups == "zero" else "zero")
            alt = singleton_advantage(other, r)
            hint = (
                f"It is {alt!r}, which matches {other.declared()}: declare it if that is your design."
                if _same(a, alt, 1e-6 * max(1.0, abs(alt)))
                else ""
            )
            raise AssertionError(
                f"singleton group: group {gid} has the one reward {r!r} and got advantage {a!r}, but "
                f"singleton_groups={spec.singleton_groups!r} gives {want!r} ({case}). {hint}"
            )
