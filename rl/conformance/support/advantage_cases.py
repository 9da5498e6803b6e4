"""What the advantage laws feed the function: rewards labelled with their group ids (`RewardBatch`), the strategies
that draw them (reward families, groups, batches) and the hazardous cells run before anything is drawn."""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from hypothesis import strategies as st

__all__ = [
    "HAZARDOUS_EQUAL_REWARDS",
    "SIGNAL_CELLS",
    "SILENT",
    "RewardBatch",
    "all_equal_cell",
    "all_equal_sweep",
    "batches_and_one_group",
    "interleave",
    "permuted_batches",
    "relabelled_batches",
    "reward_batches",
    "with_a_silent_group",
]

HAZARDOUS_EQUAL_REWARDS = (0.1, 0.2, 1 / 3, 0.7, 1.2, -2.3, 1e6 + 0.1)
"""Rewards not exact in binary (0.2 and 1.2 are the tutorial scorer's), one large: an all-equal group of them has a
float mean that can differ from them (`fmean([0.1] * 3) != 0.1`; in float32 at most group sizes)."""

GROUP_SIZES = range(2, 65)
"""The group sizes real configurations use (GRPO runs sample 2 to 64 completions per prompt)."""

SILENT = 5
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


def interleave(groups: Sequence[tuple[int, Sequence[float]]]) -> RewardBatch:
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
"""Reward families a group draws from: binary rewards and exact quarter steps; the tutorial scorer's values and tenths
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
def reward_batches(
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
def with_a_silent_group(draw: st.DrawFn) -> RewardBatch:
    """Group 5, all-equal (two to 64 members), its samples inserted anywhere among a few other groups."""
    value = draw(st.one_of(st.sampled_from(HAZARDOUS_EQUAL_REWARDS), *_FAMILIES.values()), label="the equal reward")
    size = draw(st.integers(min_value=2, max_value=64), label="group size")
    others = draw(
        reward_batches(min_groups=0, silent=True, singletons=True, exclude=SILENT, max_size=16), label="others"
    )
    ids, rewards = list(others.group_ids), list(others.rewards)
    for _ in range(size):
        at = draw(st.integers(min_value=0, max_value=len(ids)), label="position")
        ids.insert(at, SILENT)
        rewards.insert(at, value)
    return RewardBatch(tuple(ids), tuple(rewards))


_SIGNAL_NEIGHBOUR = (3, (0.0, 1.0, 0.5, 1.0))
_SINGLETON_NEIGHBOUR = (9, (0.7,))


@st.composite
def permuted_batches(draw: st.DrawFn) -> tuple[RewardBatch, tuple[int, ...]]:
    """A batch (groups with signal, all-equal groups, singletons) and a permutation of its samples."""
    batch = draw(reward_batches(silent=True, singletons=True, max_size=16), label="batch")
    return batch, tuple(draw(st.permutations(range(len(batch.rewards))), label="permutation"))


@st.composite
def relabelled_batches(draw: st.DrawFn) -> tuple[RewardBatch, tuple[int, ...]]:
    """A batch of two or more groups and new distinct ids for them, in order of first appearance."""
    batch = draw(reward_batches(min_groups=2, silent=True, singletons=True, max_size=16), label="batch")
    n = len(batch.members())
    ids = st.integers(min_value=-(10**6), max_value=10**6)
    return batch, tuple(draw(st.lists(ids, min_size=n, max_size=n, unique=True), label="new ids"))


@st.composite
def batches_and_one_group(draw: st.DrawFn) -> tuple[RewardBatch, int]:
    """A batch of two or more groups and the id of one of them."""
    batch = draw(reward_batches(min_groups=2, silent=True, singletons=True, max_size=16), label="batch")
    return batch, draw(st.sampled_from(sorted(batch.members())), label="the group kept")


def all_equal_cell(value: float, size: int) -> RewardBatch:
    """Group 5 = [value] * size, dealt among a group with signal and a singleton."""
    return interleave([_SIGNAL_NEIGHBOUR, (SILENT, [value] * size), _SINGLETON_NEIGHBOUR])


def all_equal_sweep(value: float) -> RewardBatch:
    """Groups 1002 to 1064 = [value] * 2 to [value] * 64, every size at once, dealt among a group with signal and a
    singleton: one call covers a hazardous reward at every group size."""
    silent = [(1000 + size, [value] * size) for size in GROUP_SIZES]
    batch = interleave([_SIGNAL_NEIGHBOUR, *silent, _SINGLETON_NEIGHBOUR])
    label = (
        f"groups 1002 to 1064 = [{value!r}] * 2 to [{value!r}] * 64, dealt among groups 3 (signal) and 9 (one sample)"
    )
    return replace(batch, label=label)


SIGNAL_CELLS = (
    RewardBatch((7, 7), (0.0, 1.0)),  # hand-worked in the scale law
    RewardBatch((7, 7), (0.0, 0.01)),  # std 0.005: std + eps and sqrt(var + eps) differ by 2x
    RewardBatch((7, 7, 7, 7), (0.0, 0.2, 1.0, 1.2)),  # the tutorial scorer's four values
    RewardBatch((7,) * 64, (1.0,) + (0.0,) * 63),  # one right answer in 64: A = sqrt(63) with the population std
    RewardBatch((7,) * 16, (0.2,) + (0.1,) * 15),  # one outlier among 15 equal non-binary rewards
    RewardBatch((7, 7, 7), (0.1, 0.2, 0.3)),
    RewardBatch((7, 7, 7), (1e6 + 0.1, 1e6 + 0.2, 1e6 + 0.3)),  # large magnitude, small spread
    RewardBatch((7, 7), (-2.3, 0.7)),
    RewardBatch((7, 7, 7, 7, 7), (0.5, 0.501, 0.5, 0.499, 0.5)),  # a spread of 1e-3
    interleave([(3, (0.0, 1.0, 1.0)), (5, (0.1, 0.3)), (8, (2.0, -1.0, 0.5, 0.25))]),  # three groups, interleaved
)
"""Groups with signal every law that checks them runs first."""
