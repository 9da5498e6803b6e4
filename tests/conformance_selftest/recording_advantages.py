"""An implementation whose advantages function records every batch the laws hand it (correct: it is ours).

The self-test of `--rl-seed` and `--rl-examples` reads `SEEN` after a run: which reward batches a law drew, how many.
"""

from __future__ import annotations

from collections.abc import Sequence

from rl.algorithm.advantages import group_normalized_advantages
from rl.conformance import Implementation

SEEN: list[tuple[tuple[int, ...], tuple[float, ...]]] = []


def advantages(group_ids: Sequence[int], rewards: Sequence[float]) -> list[float]:
    SEEN.append((tuple(group_ids), tuple(rewards)))
    return group_normalized_advantages(group_ids, rewards)


IMPL = Implementation(name="recording-advantages", advantages=advantages)
