"""Shape glue shared by the peer adapters: no library imports, no formula.

The conformance suite calls `advantages(group_ids, rewards)` with groups of any size whose samples are interleaved.
Libraries want a batch laid out their way; these helpers gather the suite's inputs into that layout.
"""

from __future__ import annotations

from collections.abc import Sequence


def groups_by_size(group_ids: Sequence[int]) -> dict[int, list[list[int]]]:
    """The sample indices of each group (in input order), the groups bucketed by their size, groups in order of first
    appearance: `[0, 5, 0, 7] -> {2: [[0, 2]], 1: [[1], [3]]}`.

    A library that reshapes rewards to `[num_groups, G]` takes one bucket per call, its groups laid out contiguously."""
    members: dict[int, list[int]] = {}
    for i, gid in enumerate(group_ids):
        members.setdefault(gid, []).append(i)
    buckets: dict[int, list[list[int]]] = {}
    for idx in members.values():
        buckets.setdefault(len(idx), []).append(idx)
    return buckets


def check_pair(group_ids: Sequence[int], rewards: Sequence[float]) -> None:
    if len(group_ids) != len(rewards):
        raise ValueError(f"len(group_ids)={len(group_ids)} != len(rewards)={len(rewards)}")
