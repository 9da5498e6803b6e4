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

import functools
import itertools
import math
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rl.conformance._base import ContractBase, explicit_examples, law_settings, must_provide, tier
from rl.conformance.reference import (
    TOLERANCE_FACTOR,
    advantage_denominator,
    advantage_tolerance,
    invariant_precision,
    reference_advantages,
    singleton_advantage,
)
from rl.conformance.spec import AdvantageDtype, AdvantageScale, AlgorithmSpec, StdEpsPlacement, check_spec

__all__ = ["HAZARDOUS_EQUAL_REWARDS", "AdvantageContract", "AdvantageFn", "RewardBatch"]

AdvantageFn = Callable[[Sequence[int], Sequence[float]], Sequence[float]]
"""`(group_ids, rewards) -> advantages`, one per sample in input order, like
`rl.advantages.group_normalized_advantages`."""

HAZARDOUS_EQUAL_REWARDS = (0.1, 0.2, 1 / 3, 0.7, 1.2, -2.3, 1e6 + 0.1)
"""Rewards not exact in binary (0.2 and 1.2 are the seed scorer's), one large: an all-equal group of them has a float
mean that can differ from them (`fmean([0.1] * 3) != 0.1`; in float32 at most group sizes)."""

GROUP_SIZES = range(2, 65)
"""The group sizes real configurations use (GRPO runs sample 2 to 64 completions per prompt)."""

_SILENT = 5
"""The id of the all-equal group an explicit cell or a draw puts among the others."""


@dataclass(frozen=True)
class RewardBatch:
    """Rewards labelled with their group ids, aligned index by index; a group's samples need not be contiguous."""

    group_ids: tuple[int, ...]
    rewards: tuple[float, ...]
    label: str = field(default="", compare=False)
    """What an explicit cell shows in a report instead of its (long) contents."""

    def members(self) -> dict[int, list[int]]:
        """Each group's sample indices, in order of appearance (computed once: do not modify)."""
        return self._members

    @functools.cached_property
    def _members(self) -> dict[int, list[int]]:
        out: dict[int, list[int]] = {}
        for i, gid in enumerate(self.group_ids):
            out.setdefault(gid, []).append(i)
        return out

    def group(self, gid: int) -> list[float]:
        """The rewards of group `gid`, in order of appearance."""
        return [self.rewards[i] for i in self._members[gid]]

    def __str__(self) -> str:
        return self.label or f"group_ids={list(self.group_ids)}, rewards={list(self.rewards)}"

    def __repr__(self) -> str:
        return self.label or f"RewardBatch(group_ids={self.group_ids!r}, rewards={self.rewards!r})"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(repr(self))


def _interleave(groups: Sequence[tuple[int, Sequence[float]]]) -> RewardBatch:
    """The groups' samples dealt round-robin, so that no group of two or more is contiguous."""
    dealt = [
        (gid, r)
        for column in itertools.zip_longest(*[[(gid, r) for r in rs] for gid, rs in groups])
        for gid, r in (pair for pair in column if pair is not None)
    ]
    return RewardBatch(tuple(gid for gid, _ in dealt), tuple(r for _, r in dealt))


# -- strategies: reward families -> groups -> batches ------------------------------------------------------------------

_FAMILIES: dict[str, st.SearchStrategy[float]] = {
    "quarters": st.integers(min_value=-8, max_value=8).map(lambda k: k / 4),
    "seed scorer": st.sampled_from((0.0, 0.2, 1.0, 1.2)),
    "tenths": st.integers(min_value=-30, max_value=30).map(lambda k: k / 10),
    "thirds": st.integers(min_value=-9, max_value=9).map(lambda k: k / 3),
    "near 1e6": st.integers(min_value=-20, max_value=20).map(lambda k: 1e6 + k / 10),
    "tiny spread": st.integers(min_value=-5, max_value=5).map(lambda k: 0.5 + k * 1e-3),
}
"""Reward families a group draws from: binary rewards and exact quarter steps; the seed scorer's values and tenths
and thirds, which binary floating point cannot represent; rewards near 1e6 (large magnitude, small spread); and
spreads of 1e-3, where the eps and where it enters decide the scale."""


@st.composite
def _group(draw: st.DrawFn, *, signal: bool, min_size: int = 2, max_size: int = 64) -> list[float]:
    """One group's rewards from one family; with `signal`, at least two of them differ."""
    family = draw(st.sampled_from(sorted(_FAMILIES)), label="reward family")
    size = draw(st.integers(min_value=min_size, max_value=max_size), label="group size")
    rewards = draw(st.lists(_FAMILIES[family], min_size=size, max_size=size), label="rewards")
    if signal and len(set(rewards)) == 1:
        rewards[draw(st.integers(min_value=0, max_value=size - 1), label="the odd one")] += 1.0
    return rewards


@st.composite
def _batches(
    draw: st.DrawFn,
    *,
    min_groups: int = 1,
    max_groups: int = 3,
    signal: bool = True,
    silent: bool = False,
    singletons: bool = False,
    exclude: int | None = None,
    max_size: int = 64,
) -> RewardBatch:
    """A few groups with distinct ids (negative and large ones included), their samples shuffled together. Groups have
    signal; with `silent` some may be all-equal, with `singletons` some may have one sample."""
    ids = st.integers(min_value=-(10**6), max_value=10**6).filter(lambda gid: gid != exclude)
    labels = draw(st.lists(ids, min_size=min_groups, max_size=max_groups, unique=True), label="group ids")
    samples: list[tuple[int, float]] = []
    for gid in labels:
        kinds = ["signal"] * signal + ["silent"] * silent + ["singleton"] * singletons
        kind = draw(st.sampled_from(kinds), label=f"group {gid}")
        if kind == "singleton":
            rewards = [draw(_FAMILIES["tenths"], label=f"group {gid} reward")]
        elif kind == "silent":
            value = draw(st.one_of(st.sampled_from(HAZARDOUS_EQUAL_REWARDS), _FAMILIES["quarters"]), label="value")
            rewards = [value] * draw(st.integers(min_value=2, max_value=max_size), label=f"group {gid} size")
        else:
            rewards = draw(_group(signal=True, max_size=max_size), label=f"group {gid} rewards")
        samples += [(gid, r) for r in rewards]
    order = draw(st.permutations(range(len(samples))), label="sample order")
    return RewardBatch(tuple(samples[i][0] for i in order), tuple(samples[i][1] for i in order))


@st.composite
def _with_a_silent_group(draw: st.DrawFn) -> RewardBatch:
    """Group 5, all-equal (two to 64 members), its samples inserted anywhere among a few other groups."""
    value = draw(st.one_of(st.sampled_from(HAZARDOUS_EQUAL_REWARDS), *_FAMILIES.values()), label="the equal reward")
    size = draw(st.integers(min_value=2, max_value=64), label="group size")
    others = draw(_batches(min_groups=0, silent=True, singletons=True, exclude=_SILENT, max_size=16), label="others")
    ids, rewards = list(others.group_ids), list(others.rewards)
    for _ in range(size):
        at = draw(st.integers(min_value=0, max_value=len(ids)), label="position")
        ids.insert(at, _SILENT)
        rewards.insert(at, value)
    return RewardBatch(tuple(ids), tuple(rewards))


_SIGNAL_NEIGHBOUR = (3, (0.0, 1.0, 0.5, 1.0))
_SINGLETON_NEIGHBOUR = (9, (0.7,))


@st.composite
def _permuted_batches(draw: st.DrawFn) -> tuple[RewardBatch, tuple[int, ...]]:
    """A batch (groups with signal, all-equal groups, singletons) and a permutation of its samples."""
    batch = draw(_batches(silent=True, singletons=True, max_size=16), label="batch")
    return batch, tuple(draw(st.permutations(range(len(batch.rewards))), label="permutation"))


@st.composite
def _relabelled_batches(draw: st.DrawFn) -> tuple[RewardBatch, tuple[int, ...]]:
    """A batch of two or more groups and new distinct ids for them, in order of first appearance."""
    batch = draw(_batches(min_groups=2, silent=True, singletons=True, max_size=16), label="batch")
    n = len(batch.members())
    ids = st.integers(min_value=-(10**6), max_value=10**6)
    return batch, tuple(draw(st.lists(ids, min_size=n, max_size=n, unique=True), label="new ids"))


@st.composite
def _batches_and_one_group(draw: st.DrawFn) -> tuple[RewardBatch, int]:
    """A batch of two or more groups and the id of one of them."""
    batch = draw(_batches(min_groups=2, silent=True, singletons=True, max_size=16), label="batch")
    return batch, draw(st.sampled_from(sorted(batch.members())), label="the group kept")


def _all_equal_cell(value: float, size: int) -> RewardBatch:
    """Group 5 = [value] * size, dealt among a group with signal and a singleton."""
    return _interleave([_SIGNAL_NEIGHBOUR, (_SILENT, [value] * size), _SINGLETON_NEIGHBOUR])


def _all_equal_sweep(value: float) -> RewardBatch:
    """Groups 1002 to 1064 = [value] * 2 to [value] * 64, every size at once, dealt among a group with signal and a
    singleton: one call covers a hazardous reward at every group size."""
    silent = [(1000 + size, [value] * size) for size in GROUP_SIZES]
    batch = _interleave([_SIGNAL_NEIGHBOUR, *silent, _SINGLETON_NEIGHBOUR])
    label = (
        f"groups 1002 to 1064 = [{value!r}] * 2 to [{value!r}] * 64, dealt among groups 3 (signal) and 9 (one sample)"
    )
    return replace(batch, label=label)


_SIGNAL_CELLS = (
    RewardBatch((7, 7), (0.0, 1.0)),  # hand-worked in the scale law
    RewardBatch((7, 7), (0.0, 0.01)),  # std 0.005: std + eps and sqrt(var + eps) differ by 2x
    RewardBatch((7, 7, 7, 7), (0.0, 0.2, 1.0, 1.2)),  # the seed scorer's four values
    RewardBatch((7,) * 64, (1.0,) + (0.0,) * 63),  # one right answer in 64: A = sqrt(63) with the population std
    RewardBatch((7,) * 16, (0.2,) + (0.1,) * 15),  # one outlier among 15 equal non-binary rewards
    RewardBatch((7, 7, 7), (0.1, 0.2, 0.3)),
    RewardBatch((7, 7, 7), (1e6 + 0.1, 1e6 + 0.2, 1e6 + 0.3)),  # large magnitude, small spread
    RewardBatch((7, 7), (-2.3, 0.7)),
    RewardBatch((7, 7, 7, 7, 7), (0.5, 0.501, 0.5, 0.499, 0.5)),  # a spread of 1e-3
    _interleave([(3, (0.0, 1.0, 1.0)), (5, (0.1, 0.3)), (8, (2.0, -1.0, 0.5, 0.25))]),  # three groups, interleaved
)
"""Groups with signal every law that checks them runs first."""


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


_PROBE = _interleave(
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
    @explicit_examples(*map(_all_equal_sweep, HAZARDOUS_EQUAL_REWARDS))
    @given(case=_with_a_silent_group())
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
    @explicit_examples(*_SIGNAL_CELLS)
    @given(case=_batches(silent=True))
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
    @explicit_examples(*_SIGNAL_CELLS)
    @given(case=_batches(silent=True, singletons=True))
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
        (_SIGNAL_CELLS[-1], (0, 3, 6, 1, 4, 7, 2, 5, 8)), (_all_equal_cell(0.1, 5), tuple(range(10))[::-1])
    )
    @given(case=_permuted_batches())
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
    @explicit_examples((_interleave([(9, (0.0, 1.0)), (2, (0.0, 0.5, 1.0))]), (1, 7)))
    @given(case=_relabelled_batches())
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
    @explicit_examples((_SIGNAL_CELLS[-1], 5), (_all_equal_cell(0.1, 16), _SILENT))
    @given(case=_batches_and_one_group())
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
    @explicit_examples(*_SIGNAL_CELLS)
    @given(case=_batches())
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
    @given(case=_batches(singletons=True, signal=True))
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
