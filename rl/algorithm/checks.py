"""The two checks every layer that trains on scored rollouts makes, written once: rewards are finite, and each rollout
was sampled by a policy recent enough to train on. The driver, the advantages and the trainers call these."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from rl.errors import NonFiniteRewardError, StaleBatchError

__all__ = ["check_staleness", "finite_rewards"]


def finite_rewards(rewards: Sequence[float], where: Callable[[int, float], str]) -> list[float]:
    """`rewards` as floats; `NonFiniteRewardError` at the first NaN or infinity, its message `where(index, value)`."""
    out: list[float] = []
    for index, reward in enumerate(rewards):
        value = float(reward)
        if not math.isfinite(value):
            raise NonFiniteRewardError(where(index, value))
        out.append(value)
    return out


def check_staleness(
    index: int, policy_version: int, trained_version: int, max_staleness: int, context: str = ""
) -> int:
    """The staleness of rollout `index`: `trained_version - policy_version`, 0 on-policy, 1 one step behind.

    Raises `StaleBatchError` when it is negative (the rollout claims a newer policy than the one being trained) or
    above `max_staleness`; `context` prefixes its message (the driver names the iteration).
    """
    staleness = trained_version - policy_version
    if staleness < 0 or staleness > max_staleness:
        raise StaleBatchError(index, policy_version, trained_version, max_staleness, context)
    return staleness
