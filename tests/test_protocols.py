"""`rl.protocols.is_batched` decides what `isinstance(engine, BatchedRolloutEngine)` decides, for every engine shape the
driver meets: plain, batched, a member set to None, and the simulator's tier wrapper (which forwards attributes)."""

from __future__ import annotations

from typing import Any

import pytest

from rl.protocols import BatchedRolloutEngine, is_batched
from rl.sim.durable_sim import DurableSimulator


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
    "engine",
    [Plain(), Batched(), GroupsOnly(), NoneMember(), object(), _tier(Plain()), _tier(Batched())],
    ids=["plain", "batched", "groups-only", "none-member", "object", "tier-plain", "tier-batched"],
)
def test_is_batched_agrees_with_the_runtime_checkable_protocol(engine: object) -> None:
    assert is_batched(engine) is isinstance(engine, BatchedRolloutEngine)


def test_a_batched_engine_is_batched_and_a_plain_one_is_not() -> None:
    assert is_batched(Batched()) and is_batched(_tier(Batched()))
    assert not is_batched(Plain()) and not is_batched(_tier(Plain()))
