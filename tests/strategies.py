"""Hypothesis strategies for the domain code, composed bottom-up.

rewards  ->  reward vectors / one group's rewards  ->  groups with ids (`Groups`)
log-probs  ->  log-prob tensors of one length (new, old, ref)

Tests draw from these inside the test body (`st.data()`), never through pytest fixtures, so shrinking and replay work.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from hypothesis import strategies as st

REWARD_BOUND = 1e3
"""Rewards stay within +-REWARD_BOUND: real rewards are O(1), and the tests' tolerances scale with the magnitude."""

SEED_REWARDS = (0.0, 0.2, 1.0, 1.2)
"""Every value the tutorial's scorer returns (format bonus 0.2, correct answer 1.0): ties and all-equal groups
abound."""


def finite_rewards(bound: float = REWARD_BOUND) -> st.SearchStrategy[float]:
    """Any finite float in [-bound, bound], subnormals included."""
    return st.floats(min_value=-bound, max_value=bound, allow_nan=False, allow_infinity=False)


def seed_rewards() -> st.SearchStrategy[float]:
    """One of the tutorial scorer's four reward values."""
    return st.sampled_from(SEED_REWARDS)


def rewards() -> st.SearchStrategy[float]:
    """A reward as the loop sees it: mostly the scorer's discrete values, sometimes any finite float."""
    return st.one_of(seed_rewards(), finite_rewards())


def dyadic_rewards() -> st.SearchStrategy[float]:
    """Multiples of 1/8 in [-64, 64]: exact in binary, so `a*r + b` with dyadic `a`, `b` is computed without rounding
    and an affine law can be checked up to the rounding of mean and std alone."""
    return st.integers(min_value=-512, max_value=512).map(lambda k: k / 8)


def reward_vectors(
    elements: st.SearchStrategy[float] | None = None, *, min_size: int = 1, max_size: int = 8
) -> st.SearchStrategy[list[float]]:
    """A list of rewards drawn from `elements` (default `rewards()`)."""
    return st.lists(elements if elements is not None else rewards(), min_size=min_size, max_size=max_size)


def group_rewards(
    elements: st.SearchStrategy[float] | None = None, *, min_size: int = 1, max_size: int = 8
) -> st.SearchStrategy[list[float]]:
    """One group's rewards: a free reward vector, or (as often as hypothesis picks it) one value repeated, the no-signal
    case the trainer must skip."""
    elems = elements if elements is not None else rewards()
    repeated = st.tuples(elems, st.integers(min_value=min_size, max_value=max_size)).map(lambda vn: [vn[0]] * vn[1])
    return st.one_of(reward_vectors(elems, min_size=min_size, max_size=max_size), repeated)


@dataclass(frozen=True)
class Groups:
    """Rewards labelled with their group ids, aligned index by index; a group's samples need not be contiguous."""

    group_ids: list[int]
    rewards: list[float]

    def members(self) -> dict[int, list[int]]:
        """Indices of each group's samples, in order of appearance."""
        out: dict[int, list[int]] = {}
        for i, gid in enumerate(self.group_ids):
            out.setdefault(gid, []).append(i)
        return out


@st.composite
def groups(
    draw: st.DrawFn,
    elements: st.SearchStrategy[float] | None = None,
    *,
    min_groups: int = 1,
    max_groups: int = 5,
    min_size: int = 1,
    max_size: int = 8,
    interleave: bool = True,
) -> Groups:
    """Several groups with distinct, arbitrary integer ids; with `interleave`, samples of different groups are shuffled
    together, as they arrive when rollouts finish out of order."""
    any_id = st.integers(min_value=-(2**31), max_value=2**31)
    ids = draw(st.lists(any_id, min_size=min_groups, max_size=max_groups, unique=True))
    pairs = [(gid, r) for gid in ids for r in draw(group_rewards(elements, min_size=min_size, max_size=max_size))]
    if interleave:
        pairs = draw(st.permutations(pairs))
    return Groups(group_ids=[gid for gid, _ in pairs], rewards=[r for _, r in pairs])


def logprobs(min_value: float = -20.0) -> st.SearchStrategy[float]:
    """A token log-probability: finite and <= 0."""
    return st.floats(min_value=min_value, max_value=0.0, allow_nan=False, allow_infinity=False)


def log_ratios(bound: float = 0.7) -> st.SearchStrategy[float]:
    """A per-token log importance ratio `new - old` within +-bound (0.7: ratios in [0.5, 2], either side of a clip)."""
    return st.floats(min_value=-bound, max_value=bound, allow_nan=False, allow_infinity=False)


@st.composite
def logprob_tensors(
    draw: st.DrawFn,
    *,
    min_len: int = 1,
    max_len: int = 12,
    dtype: torch.dtype = torch.float64,
    max_log_ratio: float = 0.7,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`(new_logp, old_logp, ref_logp)`: 1-D tensors of one length `T`, none requiring grad.

    Shape: each `[T]`, `min_len <= T <= max_len`.

    `new` stays within `max_log_ratio` of `old` (a policy one step stale) and of `ref`, so ratios land on both sides of
    a typical clip and the KL term is small but nonzero, as in training.
    """
    length = draw(st.integers(min_value=min_len, max_value=max_len))
    old = draw(st.lists(logprobs(), min_size=length, max_size=length))
    steps = st.lists(log_ratios(max_log_ratio), min_size=length, max_size=length)
    new = [o + d for o, d in zip(old, draw(steps), strict=True)]
    ref = [n + d for n, d in zip(new, draw(steps), strict=True)]
    return (
        torch.tensor(new, dtype=dtype),
        torch.tensor(old, dtype=dtype),
        torch.tensor(ref, dtype=dtype),
    )


def advantages(bound: float = 3.0) -> st.SearchStrategy[float]:
    """A finite advantage in [-bound, bound] (group-normalised advantages of groups of <= 10 are within +-3)."""
    return st.floats(min_value=-bound, max_value=bound, allow_nan=False, allow_infinity=False)
