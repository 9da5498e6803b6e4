"""What crosses a simulated task boundary (`rl.durable.frozen`): a consumer never shares a value its producer can
change.

Values nothing can change in place (`immutable`) are handed on as they are; a list or dict of them gets a new container
each time; anything else goes through a pickle copy. Each law here could break: a mutable value taken for immutable
would let a task and its driver share state that Flyte's serialisation keeps apart.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass, field

import pytest
from pydantic import BaseModel, ConfigDict

from rl.durable.durable_sim import DurableSimulator
from rl.durable.frozen import freeze, immutable, inputs_digest, thaw
from rl.types import ArtifactRef, Trajectory, Turn, Weights, WorldRef


@dataclass(frozen=True)
class Point:
    x: float
    label: str


@dataclass(frozen=True)
class Holder:
    items: list[int]


@dataclass
class Loose:
    x: int


class PointChild(Point):
    """Not itself a dataclass: it may set attributes of its own."""


@dataclass(frozen=True)
class Nested:
    point: Point
    pair: tuple[int, str]
    tags: frozenset[str] = field(default_factory=frozenset)


class Model(BaseModel):
    model_config = ConfigDict(frozen=True)
    name: str


class OpenModel(BaseModel):
    model_config = ConfigDict(frozen=True, extra="allow")
    name: str


class Mutable(BaseModel):
    name: str


class Flt(float):
    pass


@dataclass(frozen=True)
class DeclaredList:
    """Declared a list: never taken as immutable, even holding a tuple (the declaration is read once per class)."""

    items: list[int] | None


@dataclass(frozen=True)
class HoldsLoose:
    inner: Loose


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (1, True),
        ("s", True),
        (None, True),
        (b"b", True),
        ((1, ("a", 2.5)), True),
        (frozenset({1, 2}), True),
        (Point(1.0, "a"), True),
        (Nested(Point(1.0, "a"), (1, "b"), frozenset({"t"})), True),
        (ArtifactRef("mem://a", "d"), True),
        (Model(name="a"), True),
        (WorldRef(world_id="w", name="n", version="v"), True),
        ([1, 2], False),
        ({"a": 1}, False),
        ((1, [2]), False),
        (Holder([1]), False),
        (Loose(1), False),
        (PointChild(1.0, "a"), False),
        (Nested(Point(1.0, "a"), (1, "b"), frozenset({(1, 2)})), True),
        (Flt(1.0), False),
        (OpenModel(name="a", more=[1]), False),
        (Mutable(name="a"), False),
        (Weights(version=1, doc_prior={"w": [0.5]}), False),
        (DeclaredList((1, 2)), False),  # type: ignore[arg-type]
        (HoldsLoose(Loose(1)), False),
    ],
)
def test_immutable_takes_only_what_nothing_can_change(value: object, expected: bool) -> None:
    assert immutable(value) is expected


def test_a_list_of_scalars_is_a_new_list_on_every_thaw_and_the_record_ignores_later_mutation() -> None:
    original = [1.0, 2.0]
    record = freeze(original)
    original.append(3.0)
    first, second = thaw(record), thaw(record)
    assert first == second == [1.0, 2.0]
    first.append(9.0)
    assert thaw(record) == [1.0, 2.0] and first is not second


class Key:
    """Hashable, yet changeable in place."""

    def __init__(self) -> None:
        self.seen: list[int] = []

    def __hash__(self) -> int:
        return 1


def test_a_dict_whose_keys_can_change_is_copied_deeply() -> None:
    key = Key()
    record = freeze({key: 1})
    key.seen.append(1)
    (copied,) = thaw(record)
    assert copied is not key and copied.seen == []


def test_an_immutable_value_is_handed_on_as_it_is() -> None:
    value = Nested(Point(1.0, "a"), (1, "b"))
    assert thaw(freeze(value)) is value


def test_a_mutable_value_is_copied_deeply() -> None:
    value = {"weights": [[1, 2], [3]]}
    record = freeze(value)
    value["weights"][0].append(99)
    copy = thaw(record)
    assert copy == {"weights": [[1, 2], [3]]}
    copy["weights"][1].append(7)
    assert thaw(record) == {"weights": [[1, 2], [3]]}


def test_inputs_keep_their_digest_and_each_attempt_gets_its_own_dict() -> None:
    inputs = {"ref": ArtifactRef("mem://a", "d"), "n": 3}
    digest, record = inputs_digest("t", inputs)
    again, _ = inputs_digest("t", dict(inputs))
    assert digest == again
    one, two = thaw(record), thaw(record)
    one["n"] = 4
    assert two == {"ref": ArtifactRef("mem://a", "d"), "n": 3}


def test_a_task_cannot_change_the_immutable_inputs_dict_its_driver_holds() -> None:
    sim = DurableSimulator(seed=3)

    @sim.task
    async def consume(ref: ArtifactRef, tags: tuple[str, ...]) -> int:
        return len(tags)

    @sim.task
    async def produce() -> list[str]:
        return ["a", "b"]

    async def driver() -> tuple[list[str], list[str], int]:
        made = await produce()
        made.append("driver's own")
        again = await produce()
        return made, again, await consume(ArtifactRef("mem://a", "d"), ("x",))

    assert sim.run(driver).output == (["a", "b", "driver's own"], ["a", "b"], 1)


def test_agentic_models_pickle_equal_frozen_and_with_their_fields_set() -> None:
    traj = Trajectory(
        trial_id="t",
        world_id="w",
        weights_version=1,
        turns=[Turn(doc=1, found=False), Turn(doc=2, found=True)],
        answer=None,
        files_written=["answer.txt"],
        elapsed_s=0.5,
        fork_name="f",
    )
    copy = pickle.loads(pickle.dumps(traj, pickle.HIGHEST_PROTOCOL))
    assert copy == traj and copy.model_fields_set == traj.model_fields_set
    assert copy.turns is not traj.turns and copy.model_dump() == traj.model_dump()
    with pytest.raises(ValueError, match="frozen"):
        copy.answer = "x"  # type: ignore[misc]
    weights = Weights(version=2)
    assert pickle.loads(pickle.dumps(weights)).model_fields_set == {"version"}
