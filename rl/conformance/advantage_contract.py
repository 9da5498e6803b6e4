"""The advantage laws: GRPO's group-relative advantages, checked as a function `(group_ids, rewards) -> advantages`.

Subclass `AdvantageContract` and provide its `advantages` fixture (and, when your choices differ from ours, the
`algorithm` fixture returning your `AlgorithmSpec`). An invariant holds for every GRPO variant whatever it declares
(a no-signal group gives exact zeros; centred; ranked as the rewards; order, labels and other groups do not matter).
A choice law compares to the float64 reference computed from the declaration (`rl.conformance.support.reference`) at the
declared dtype's tolerance, and says which declaration the values would match. The hazardous cells (all-equal groups
of rewards not exact in binary, large magnitudes, tiny spreads) are explicit examples, run before anything is drawn.
Pure Python: no torch import. An example subclass and every law: docs/conformance.md
(#the-other-way-in-subclass-the-contracts, #declaring-your-choices-algorithmspec).
"""

from __future__ import annotations

import itertools
import math
import statistics
from dataclasses import replace

import pytest
from hypothesis import given

from rl.conformance.algorithm_spec import (
    ADVANTAGE_FIELDS,
    AlgorithmSpec,
    check_spec,
)
from rl.conformance.support.advantage_calls import (
    AdvantageFn,
    call_advantages,
    invariant_tolerance,
    matching_declaration,
    same_within,
)
from rl.conformance.support.advantage_cases import (
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
from rl.conformance.support.contract_base import ContractBase, explicit_examples, law_settings, must_provide, tier
from rl.conformance.support.reference import (
    TOLERANCE_FACTOR,
    advantage_denominators,
    advantage_tolerance,
    invariant_precision,
    reference_advantages,
    singleton_advantage,
)

__all__ = ["AdvantageContract", "AdvantageFn"]


@tier("advantages")
class AdvantageContract(ContractBase):
    """Laws of GRPO's group-relative advantage `A_i = (r_i - mean(r_g)) / D_g` (DeepSeekMath §4.1.2) with the scale
    `D_g` the `algorithm` fixture declares: exact zeros for an all-equal group, centred, ranked as the rewards, and no
    dependence on sample order, group labels or other groups, whatever the declaration."""

    @pytest.fixture
    def advantages(self) -> AdvantageFn:
        """Return the function under test: `(group_ids, rewards) -> list[float]`, one advantage per sample in input
        order, like `rl.algorithm.advantages.group_normalized_advantages`."""
        raise must_provide(
            "AdvantageContract",
            "advantages",
            "a callable (group_ids, rewards) -> list[float] like rl.algorithm.advantages.group_normalized_advantages",
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
        got = call_advantages(advantages, case, algorithm)
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
        its group's mean, not on zero or on the batch mean (every declarable scale centres). A leave-one-out baseline
        centres too (`r_i - mean of the others` is `n / (n - 1)` times `r_i - mean`), but divides each member by its
        own std: there the numerators `A_i D_i` sum to zero, `D_i` the declared denominators."""
        spec = check_spec(algorithm)
        got = call_advantages(advantages, case, spec)
        for gid, idx in case.members().items():
            group = case.group(gid)
            if len(group) < 2 or len(set(group)) == 1:
                continue
            out = [got[i] for i in idx]
            if spec.advantage_baseline == "leave_one_out":
                denominators = advantage_denominators(spec, group, case.rewards)
                out = [a * d / max(denominators) for a, d in zip(out, denominators, strict=True)]
            total = math.fsum(out)
            tolerance = len(group) * invariant_tolerance(algorithm, group, out)
            hint = ""
            if abs(total) > tolerance:
                fits = matching_declaration(spec, advantages, case, got)
                hint = f" They match {fits}: declare it if that is your design." if fits else ""
            assert abs(total) <= tolerance, (
                f"zero mean: group {gid} with rewards {group} got advantages {[got[i] for i in idx]}, which "
                + (
                    "times their declared leave-one-out denominators "
                    if spec.advantage_baseline != "group_mean"
                    else ""
                )
                + f"sum to {total!r} (tolerance {tolerance:.3g}) in {case}: they are not centred on the group's mean."
                + hint
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
        got = call_advantages(advantages, case, algorithm)
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
        (SIGNAL_CELLS[-1], (0, 3, 6, 1, 4, 7, 2, 5, 8)), (all_equal_cell(0.1, 8), tuple(range(13))[::-1])
    )
    @given(case=permuted_batches())
    def test_advantages_permuting_samples_permutes_advantages(
        self, advantages: AdvantageFn, algorithm: AlgorithmSpec, case: tuple[RewardBatch, tuple[int, ...]]
    ) -> None:
        """Reordering the samples (ids and rewards together) reorders the advantages the same way: an advantage
        depends on its group's rewards, not on where the group's samples sit (they need not be contiguous)."""
        check_spec(algorithm)
        batch, order = case
        got = call_advantages(advantages, batch, algorithm)
        moved = RewardBatch(tuple(batch.group_ids[i] for i in order), tuple(batch.rewards[i] for i in order))
        permuted = call_advantages(advantages, moved, algorithm)
        members = batch.members()
        for k, i in enumerate(order):
            gid = batch.group_ids[i]
            tolerance = invariant_tolerance(algorithm, batch.group(gid), [got[j] for j in members[gid]])
            assert same_within(permuted[k], got[i], tolerance), (
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
        got = call_advantages(advantages, batch, algorithm)
        renamed = RewardBatch(tuple(rename[gid] for gid in batch.group_ids), batch.rewards)
        relabelled = call_advantages(advantages, renamed, algorithm)
        members = batch.members()
        for i, (a, b) in enumerate(zip(got, relabelled, strict=True)):
            gid = batch.group_ids[i]
            tolerance = invariant_tolerance(algorithm, batch.group(gid), [got[j] for j in members[gid]])
            assert same_within(a, b, tolerance), (
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
        (r -> 3r + 1) leaves them unchanged (no batch mean, no batch std). Under `std_scope="batch"` (a declared batch
        std) the other groups may change them by one common positive factor, never their signs or proportions."""
        spec = check_spec(algorithm)
        batch, target = case
        changed = RewardBatch(
            batch.group_ids,
            tuple(r if gid == target else 3 * r + 1 for gid, r in zip(batch.group_ids, batch.rewards, strict=True)),
        )
        before = call_advantages(advantages, batch, spec)
        after = call_advantages(advantages, changed, spec)
        idx = batch.members()[target]
        factor = 1.0
        if spec.std_scope == "batch":
            largest = max(idx, key=lambda i: abs(before[i]))
            factor = after[largest] / before[largest] if before[largest] and math.isfinite(before[largest]) else 1.0
            assert factor > 0 or not math.isfinite(factor), (
                f"independent groups (up to the declared batch std's factor): group {target} of {batch} changed sign "
                f"once only the other groups' rewards changed to {list(changed.rewards)}: {before[largest]!r} became "
                f"{after[largest]!r}"
            )
        tolerance = invariant_tolerance(spec, batch.group(target), [before[i] for i in idx]) * max(1.0, factor)
        hint = ""
        if not all(same_within(before[i] * factor, after[i], tolerance) for i in idx):
            fits = matching_declaration(spec, advantages, batch, before)
            hint = f" They match {fits}: declare it if that is your design." if fits else ""
        for i in idx:
            assert same_within(before[i] * factor, after[i], tolerance), (
                f"independent groups: sample {i} of group {target} (reward {batch.rewards[i]!r}) has advantage "
                f"{before[i]!r} in {batch}, but {after[i]!r} once only the other groups' rewards changed to "
                f"{list(changed.rewards)}"
                + (
                    f" (the declared batch std allows one common factor, {factor!r} from the group's largest "
                    "advantage: its proportions changed)"
                    if spec.std_scope == "batch"
                    else ""
                )
                + hint
            )

    # -- choices -------------------------------------------------------------------------------------------------------

    @law_settings(max_examples=15)
    @explicit_examples(*SIGNAL_CELLS)
    @given(case=reward_batches())
    def test_advantages_scale_as_declared(
        self, advantages: AdvantageFn, algorithm: AlgorithmSpec, case: RewardBatch
    ) -> None:
        """Every group of two or more with signal gets the declared `(r - baseline) / D` (the group's mean or the
        others' (leave-one-out); population or sample std, of the group or the batch, or none; the declared eps where
        it enters) within the declared dtype's tolerance. The group [0, 1] thus gets ±0.5 / (0.5 + 1e-4) by default
        (the sample std, 0.7071, would give ±0.7070)."""
        spec = check_spec(algorithm)
        got = call_advantages(advantages, case, spec)
        expected = reference_advantages(spec, case.group_ids, case.rewards)
        for gid, idx in case.members().items():
            group = case.group(gid)
            if len(group) < 2 or len(set(group)) == 1:
                continue
            out = [got[i] for i in idx]
            denominators = advantage_denominators(spec, group, case.rewards)
            for k, (r, a, i) in enumerate(zip(group, out, idx, strict=True)):
                want = expected[i]
                tolerance = advantage_tolerance(spec, group, want, case.rewards)
                if same_within(a, want, tolerance) and not math.isnan(a):
                    continue
                mean = statistics.fmean(group)
                implied = (r - mean) / a if a and math.isfinite(a) else math.nan
                fits = matching_declaration(spec, advantages, case, got)
                raise AssertionError(
                    f"declared scale: group {gid} with rewards {group} got advantages {out}; reward {r!r} has "
                    f"{a!r}, but {spec.declared(ADVANTAGE_FIELDS)} gives {want!r}, dividing by "
                    f"{denominators[k]!r} (tolerance {tolerance:.3g} for {spec.advantage_dtype}); the values divide by "
                    f"{implied!r} (r - group mean over the advantage; population std {statistics.pstdev(group)!r}, "
                    f"sample std {statistics.stdev(group)!r}). "
                    + (
                        f"They match {fits}: declare it if that is your design."
                        if fits
                        else "No declarable scale, baseline, scope, eps or dtype matches them."
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
        ("zero", a no-signal group a trainer skips), its reward scaled as if mean 0 and std 1 ("reward"), or, where
        groups of one never occur ("refused"), a refusal: the call raises, or returns NaN for that sample, never a
        finite number a trainer would silently train on."""
        spec = check_spec(algorithm)
        singles = [idx[0] for idx in case.members().values() if len(idx) == 1]
        if spec.singleton_groups == "refused":
            try:
                raw = [float(a) for a in advantages(list(case.group_ids), list(case.rewards))]
            except Exception:  # the refusal: an assert or a typed error, whichever the implementation raises
                return
            silent = [(i, raw[i]) for i in singles if i < len(raw) and not math.isnan(raw[i])]
            assert not silent, (
                f"singleton group: {spec.declared(ADVANTAGE_FIELDS)} declares that a group of one never occurs, "
                f"so it must be refused (raise, or NaN for it), but sample {silent[0][0]} (reward "
                f"{case.rewards[silent[0][0]]!r}), alone in its group, got {silent[0][1]!r}: a group of one silently "
                f"trained on ({case}). Declare the convention it follows, singleton_groups='zero' or 'reward'"
            )
            return
        try:
            got = call_advantages(advantages, case, spec)
        except Exception as exc:
            refused = replace(spec, singleton_groups="refused").declared(ADVANTAGE_FIELDS)
            raise AssertionError(
                f"singleton group: {case} has a group of one and the call raised {type(exc).__name__}: {exc}. If "
                f"groups of one never occur in your trainer, declare {refused}: declare it if that is your design."
            ) from exc
        for i in singles:
            gid = case.group_ids[i]
            r, a, want = case.rewards[i], got[i], singleton_advantage(spec, case.rewards[i])
            ok = (
                a == 0.0
                if spec.singleton_groups == "zero"
                else same_within(a, want, advantage_tolerance(spec, [r], want))
            )
            if ok:
                continue
            other = replace(spec, singleton_groups="reward" if spec.singleton_groups == "zero" else "zero")
            alt = singleton_advantage(other, r)
            hint = (
                f"It is {alt!r}, which matches {other.declared(ADVANTAGE_FIELDS)}: declare it if that is your design."
                if same_within(a, alt, 1e-6 * max(1.0, abs(alt)))
                else ""
            )
            if math.isnan(a):
                hint += (
                    " NaN is a refusal: if groups of one never occur, declare "
                    + replace(spec, singleton_groups="refused").declared(ADVANTAGE_FIELDS)
                    + "."
                )
            raise AssertionError(
                f"singleton group: group {gid} has the one reward {r!r} and got advantage {a!r}, but "
                f"singleton_groups={spec.singleton_groups!r} gives {want!r} ({case}). {hint}"
            )
