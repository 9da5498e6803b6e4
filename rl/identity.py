"""Content identity: a stable digest of a value, the way Flyte identifies an action by the hash of its inputs.

Pure (no flyte or torch import). Dict keys are sorted (mapping order carries no meaning); list order is kept, because a
list's order is part of its value — which is exactly why a driver must canonicalise step inputs (the agentic tutorial's
unsorted rewards made the train step's identity change between attempts).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import hashlib
import json
import math
from typing import Any

from rl.errors import UnhashableInputError

RECORDED_AS = "recorded_as"
"""Field metadata: the name a field is written under in recorded values (checkpoints, `metrics.jsonl`, action ids)
when the code's name for it changed after values were recorded (`rl.types.IterationMetrics.policy_version`)."""


@functools.cache
def _recorded_names(cls: type) -> tuple[tuple[str, str], ...]:
    """Each field of dataclass `cls` as (its name, the name it is recorded under)."""
    return tuple((f.name, f.metadata.get(RECORDED_AS, f.name)) for f in dataclasses.fields(cls))


def recorded_dict(value: Any) -> Any:
    """`dataclasses.asdict(value)` with each field under the name it is recorded under (`RECORDED_AS`)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {recorded: recorded_dict(getattr(value, name)) for name, recorded in _recorded_names(type(value))}
    if isinstance(value, list | tuple):
        return type(value)(recorded_dict(v) for v in value)
    if isinstance(value, dict):
        return type(value)((recorded_dict(k), recorded_dict(v)) for k, v in value.items())
    return copy.deepcopy(value)


def recorded_repr(value: Any) -> str:
    """`repr(value)` of a dataclass, each field under its recorded name (a digest of a repr stays the same)."""
    kind: type = type(value)
    shown = {f.name for f in dataclasses.fields(kind) if f.repr}
    fields = ", ".join(f"{rec}={getattr(value, name)!r}" for name, rec in _recorded_names(kind) if name in shown)
    return f"{kind.__qualname__}({fields})"


def from_recorded(cls: type, d: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments of `cls` from a recorded mapping `d` (keys under their recorded names), in `d`'s order."""
    names = {recorded: name for name, recorded in _recorded_names(cls) if recorded != name}
    return {names.get(k, k): v for k, v in d.items()}


@functools.cache
def _omitted_at_default(cls: type) -> dict[str, Any]:
    """The fields of `cls` marked `metadata={"identity": "omit_default"}`, with their defaults: a field added after
    values were recorded leaves their identity unchanged while it holds its default (`rl.types.SamplingSettings`)."""
    return {f.name: f.default for f in dataclasses.fields(cls) if f.metadata.get("identity") == "omit_default"}


_SCALARS = frozenset({type(None), bool, int, str})


def canonical(value: Any) -> Any:
    """A JSON-ready form of `value` that two equal values share, whatever their container order for mappings."""
    kind: type = type(value)
    if kind in _SCALARS:
        return value
    if kind is float:
        # repr round-trips exactly; NaN and infinities would otherwise break JSON and equality.
        return value if math.isfinite(value) else {"__float__": repr(value)}
    if kind is list or kind is tuple:
        # Token ids, log-probs and rewards are long flat lists of scalars: pass them through when nothing needs work.
        for v in value:
            t = type(v)
            if t not in _SCALARS and not (t is float and math.isfinite(v)):
                return [canonical(v) for v in value]
        return value if kind is list else list(value)
    if kind is dict and all(type(k) is str for k in value):
        # The common mapping (str keys) in key order, scalars taken as they are: this was most of a digest's time.
        out: dict[str, Any] = {}
        for k in sorted(value):
            v = value[k]
            out[k] = v if type(v) in _SCALARS else canonical(v)
        return out
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return {"__float__": repr(value)} if not math.isfinite(value) else value
    if isinstance(value, bytes | bytearray | memoryview):
        return {"__bytes__": hashlib.blake2b(bytes(value), digest_size=16).hexdigest()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields: dict[str, Any] = {"__type__": kind.__qualname__}
        omitted = _omitted_at_default(kind)
        for name, recorded in _recorded_names(kind):
            v = getattr(value, name)
            if omitted and name in omitted and v == omitted[name]:
                continue
            fields[recorded] = v if type(v) in _SCALARS else canonical(v)
        return fields
    model_dump = getattr(value, "model_dump", None)
    if callable(model_dump):  # pydantic models, without importing pydantic here
        return {"__type__": kind.__qualname__, **canonical(model_dump())}
    if isinstance(value, dict):
        return {str(k): canonical(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, list | tuple):
        return [canonical(v) for v in value]
    raise UnhashableInputError(
        f"cannot derive a content identity for a value of type {type(value).__name__}; "
        "pass dataclasses, pydantic models, lists, dicts, str, int, float, bool, bytes or None"
    )


def content_digest(*parts: Any) -> str:
    """A 32-hex-digit blake2b digest of the canonical JSON of `parts`."""
    payload = json.dumps([canonical(p) for p in parts], sort_keys=True, separators=(",", ":"), allow_nan=False)
    return json_digest(payload)


def json_digest(payload: str) -> str:
    """The 32-hex-digit blake2b digest of canonical JSON text already made (what `content_digest` hashes)."""
    return hashlib.blake2b(payload.encode(), digest_size=16).hexdigest()
