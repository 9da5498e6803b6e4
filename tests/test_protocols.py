"""`rl.protocols.is_batched` decides what `isinstance(engine, BatchedRolloutEngine)` decides, for every engine shape the
driver meets: plain, batched, a member set to None, and the simulator's tier wrapper (which forwards attributes, and
which `isinstance` sees through only up to Python 3.11: from 3.12 it looks members up statically)."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from rl.durable.durable_sim import DurableSimulator
from rl.durable.execution import Tier
from rl.protocols import BatchedRolloutEngine, is_batched


class Plain:
    async def generate(self, request: Any) -> list[Any]:
        return []


class Batched(Plain):
    async def generate_groups(self, requests: Any) -> list[list[Any]]:
        return []


class GroupsOnly:
    async def generate_groups(self, requests: Any) -> list[list[Any]]:
        return []


class NoneMember(Plain):
    generate_groups = None


def _tier(engine: object) -> object:
    return DurableSimulator(seed=0).tier(engine, "rollout", generate={"retries": 0})


@pytest.mark.parametrize(
    ("engine", "batched"),
    [
        (Plain(), False),
        (Batched(), True),
        (GroupsOnly(), False),
        (NoneMember(), False),
        (object(), False),
        (_tier(Plain()), False),
        (_tier(Batched()), True),
    ],
    ids=["plain", "batched", "groups-only", "none-member", "object", "tier-plain", "tier-batched"],
)
def test_is_batched_agrees_with_the_runtime_checkable_protocol(engine: object, batched: bool) -> None:
    """As `isinstance` decides it for engines that define their members, and as 3.11's did for forwarded ones: the
    simulator's wrapper of a batched engine is driven as the batched engine it wraps, on every Python."""
    assert is_batched(engine) is batched
    if not isinstance(engine, Tier) or sys.version_info < (3, 12):
        assert is_batched(engine) is isinstance(engine, BatchedRolloutEngine)


def test_a_batched_engine_is_batched_and_a_plain_one_is_not() -> None:
    assert is_batched(Batched()) and is_batched(_tier(Batched()))
    assert not is_batched(Plain()) and not is_batched(_tier(Plain()))
