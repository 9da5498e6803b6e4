"""`rl.identity.canonical` fixes every action's identity (recorded histories pin the digests): a faster version must
give exactly the form, key order included, that the first version gave for every value."""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import math
from collections import OrderedDict
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict

from rl.errors import UnhashableInputError
from rl.identity import canonical, content_digest


def _first_canonical(value: Any) -> Any:
    """The canonical form as first written (kept here as the specification the faster one must match)."""
    kind = type(value)
    if kind in (type(None), bool, int, str):
        return value
    if kind is list or kind is tuple:
        if all(type(v) in (type(None), bool, int, str) or (type(v) is float and math.isfinite(v)) for v in value):
            return value if kind is list else list(value)
        return [_first_canonical(v) for v in value]
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return {"__float__": repr(value)} if not math.isfinite(value) else value
    if isinstance(value, bytes | bytearray | memoryview):
        return {"__bytes__": hashlib.blake2b(bytes(value), digest_size=16).hexdigest()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: _first_canonical(getattr(value, f.name)) for f in dataclasses.fields(value)}
        return {"__type__": type(value).__qualname__, **fields}
    model_dump = getattr(value, "model_dump", None)
    if callable(model_dump):
        return {"__type__": type(value).__qualname__, **_first_canonical(model_dump())}
    if isinstance(value, dict):
        return {str(k): _first_canonical(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, list | tuple):
        return [_first_canonical(v) for v in value]
    raise UnhashableInputError(type(value).__name__)


class _Level(enum.IntEnum):
    LOW = 1


class _Name(str):
    """A str subclass, as a key and as a value."""


@dataclasses.dataclass(frozen=True)
class _Pair:
    left: Any
    right: Any = 0.5


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)
    name: str
    scores: dict[str, float]
    ids: tuple[int, ...] = ()


_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=4)
    | st.sampled_from([-0.0, _Level.LOW, _Name("n"), b"\x00b", bytearray(b"ab")])
)
_keys = st.text(max_size=3) | st.integers(-3, 12) | st.sampled_from([True, None, 1.5, _Name("k")])


def _containers(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return (
        st.lists(children, max_size=4)
        | st.lists(children, max_size=4).map(tuple)
        | st.dictionaries(st.text(max_size=3), children, max_size=4)
        | st.dictionaries(_keys, children, max_size=4)
        | st.dictionaries(st.text(max_size=3), children, max_size=3).map(OrderedDict)
        | st.builds(_Pair, children, children)
        | st.builds(_Model, name=st.text(max_size=3), scores=st.dictionaries(st.text(max_size=2), st.floats()))
    )


_values = st.recursive(_scalars, _containers, max_leaves=20)


@pytest.mark.heavy
@settings(max_examples=500)
@given(st.data())
def test_the_canonical_form_is_the_first_versions_key_order_and_types_included(data):
    value = data.draw(_values)
    assert repr(canonical(value)) == repr(_first_canonical(value))


@given(st.data())
def test_a_digest_is_unchanged_for_any_value(data):
    value = data.draw(_values)
    payload = json.dumps([_first_canonical(value)], sort_keys=True, separators=(",", ":"), allow_nan=False)
    assert content_digest(value) == hashlib.blake2b(payload.encode(), digest_size=16).hexdigest()
