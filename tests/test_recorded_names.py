"""A field renamed in the code keeps the name it was recorded under (`rl.identity.RECORDED_AS`): checkpoints,
`metrics.jsonl`, digests and traces written before the rename keep their bytes, and read back."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from rl.identity import RECORDED_AS, canonical, content_digest, from_recorded, recorded_dict, recorded_repr
from rl.storage.checkpoint.format import DriverState, decode_state, encode_state
from rl.types import ArtifactRef, IterationMetrics


@dataclass(frozen=True)
class _Old:
    a: int
    old: list[float]
    c: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class _New:
    a: int
    new: list[float] = field(metadata={RECORDED_AS: "old"})
    c: dict[str, Any] = field(default_factory=dict)


_Old.__qualname__ = _New.__qualname__ = "Row"  # the same class, before and after its field's rename

_values = st.tuples(
    st.integers(), st.lists(st.floats(allow_nan=False)), st.dictionaries(st.text(max_size=3), st.integers())
)


@given(_values)
def test_a_renamed_field_is_recorded_digested_and_shown_under_its_old_name(value):
    old, new = _Old(*value), _New(*value)
    assert json.dumps(recorded_dict(new)) == json.dumps(dataclasses.asdict(old))  # key order included
    assert canonical(new) == canonical(old) and content_digest(new) == content_digest(old)
    assert recorded_repr(new) == repr(old)
    assert _New(**from_recorded(_New, dataclasses.asdict(old))) == new


def test_recorded_dict_copies_what_it_records():
    row = _New(1, [1.0], {"k": [2]})
    recorded = recorded_dict(row)
    recorded["old"].append(3.0)
    recorded["c"]["k"].append(4)
    assert row == _New(1, [1.0], {"k": [2]})


def _row(version: int) -> IterationMetrics:
    return IterationMetrics(version - 1, version, 8, 0.5, 1.0, 0.1, 8, "q", "c", 1.0)


def test_metrics_rows_and_checkpoints_record_the_policy_version_as_schema_1s_adapter_version():
    row = _row(3)
    assert list(row.to_dict())[:2] == ["iteration", "adapter_version"] and "policy_version" not in row.to_dict()
    assert IterationMetrics.from_dict(row.to_dict()) == row
    ref = ArtifactRef(uri="mem://a", digest="d")
    state = dataclasses.replace(DriverState.initial("c" * 32, ref, ref), iteration=2, policy_version=3, history=[row])
    blob = encode_state(state)
    doc = json.loads(blob)
    assert doc["state"]["adapter_version"] == 3 and doc["state"]["history"][0]["adapter_version"] == 3
    assert b"policy_version" not in blob
    assert decode_state(blob) == state
