"""The GRPO driver's checkpoint format: a versioned, self-verifying JSON document.

The blob is `{"schema": N, "digest": <content digest of state>, "state": {...}}`. The digest is a checksum: it catches
a torn write or damaged storage, but anyone can recompute it, so it proves nothing about who wrote the file. A missing
schema means a foreign blob, and a different configuration digest means the checkpoint belongs to another run shape:
each is its own error type, and each message says what to do.

A seal, optionally: with `RL_RUN_KEY` set (a secret a team shares), every checkpoint written carries
`"seal": HMAC-SHA256(key, schema and digest)`, and a checkpoint read is refused unless its seal verifies, so one
forged or edited by someone without the key (digest recomputed or not) is refused. The digest covers the whole state,
so sealing it seals the state. Without the key a seal is not checked (there is nothing to check it with).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import hmac
import json
import math
import os
import weakref
from dataclasses import asdict, dataclass, field
from typing import Any

from rl.errors import CheckpointCorruptError, CheckpointSchemaError, CheckpointSealError, UntrustedValueError
from rl.identity import content_digest, json_digest
from rl.storage.checkpoint.schema import STATE
from rl.strict_json import tag_non_finite, untag_non_finite
from rl.types import ArtifactRef, EvalResult, IterationMetrics
from rl.untrusted import parse_json, validate

SCHEMA_VERSION = 1
RUN_KEY_ENV = "RL_RUN_KEY"


@dataclass(frozen=True)
class DriverState:
    """Everything a later driver attempt needs to continue at `iteration + 1` exactly as an uninterrupted run would."""

    config_digest: str
    iteration: int
    adapter: ArtifactRef
    adapter_version: int
    optimizer_state: ArtifactRef
    history: list[IterationMetrics] = field(default_factory=list)
    evals: list[EvalResult] = field(default_factory=list)
    # The adapter that generated the next pipelined batch (one step behind `adapter`), and the eval still in flight.
    previous_adapter: ArtifactRef | None = None
    previous_version: int = 0
    pending_eval: tuple[ArtifactRef, int] | None = None
    buffer_version: str | None = None
    # The configuration's fields (`canonical(config)`), so that a mismatch can name what differs, not just two digests.
    config: dict[str, Any] | None = None

    @classmethod
    def initial(cls, config_digest: str, adapter: ArtifactRef, optimizer_state: ArtifactRef) -> DriverState:
        return cls(config_digest, -1, adapter, 0, optimizer_state)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> DriverState:
        pending = d.get("pending_eval")
        previous = d.get("previous_adapter")
        return cls(
            config_digest=d["config_digest"],
            iteration=d["iteration"],
            adapter=ArtifactRef(**d["adapter"]),
            adapter_version=d["adapter_version"],
            optimizer_state=ArtifactRef(**d["optimizer_state"]),
            history=[IterationMetrics.from_dict(row) for row in d["history"]],
            evals=[EvalResult(**e) for e in d["evals"]],
            previous_adapter=ArtifactRef(**previous) if previous else None,
            previous_version=d["previous_version"],
            pending_eval=(ArtifactRef(**pending[0]), pending[1]) if pending else None,
            buffer_version=d.get("buffer_version"),
            config=d.get("config"),
        )


def encode_state(state: DriverState) -> bytes:
    # A NaN loss or an infinite grad norm in the history is written as {"__float__": "nan"}, the form the digest
    # already hashes it in, so the checkpoint is strict JSON and a resume restores the exact value.
    try:
        text, canonical_text = _plain_texts(state)
    except _NotPlain:  # a value of another type (a float subclass, a non-str key): the general path, same bytes
        body = tag_non_finite(state.to_json())
        digest = content_digest(body)
        text = json.dumps(body, allow_nan=False)
    else:
        digest = json_digest(f"[{canonical_text}]")  # = _plain_digest(body)
    key = os.environ.get(RUN_KEY_ENV)
    sealed = f', "seal": {json.dumps(seal(key, SCHEMA_VERSION, digest), allow_nan=False)}' if key else ""
    head = f'"schema": {SCHEMA_VERSION}, "digest": {json.dumps(digest, allow_nan=False)}'
    return f'{{{head}, "state": {text}{sealed}}}'.encode()


_ROW_LISTS = ("history", "evals")  # the fields that grow by a row an iteration; each row's text is made once
_ROW_TEXTS: dict[int, tuple[weakref.ref[Any], str, str]] = {}


def _plain_texts(state: DriverState) -> tuple[str, str]:
    """`json.dumps(_plain_body(state))` and its canonical form (sorted keys, no spaces), built from each history and
    eval row's texts, made once per row object (rows are frozen and never edited in place, only replaced): writing
    every row again each iteration made a run's checkpoints quadratic in its length."""
    parts: dict[str, tuple[str, str]] = {}
    for name in _field_names(DriverState):
        value = getattr(state, name)
        if name in _ROW_LISTS and type(value) is list:
            texts = [_row_texts(row) for row in value]
            parts[name] = ("[" + ", ".join(t for t, _ in texts) + "]", "[" + ",".join(c for _, c in texts) + "]")
        else:
            parts[name] = _texts(_plain_body(value))
    text = "{" + ", ".join(f"{json.dumps(k, allow_nan=False)}: {t}" for k, (t, _) in parts.items()) + "}"
    canonical_text = "{" + ",".join(f"{json.dumps(k, allow_nan=False)}:{parts[k][1]}" for k in sorted(parts)) + "}"
    return text, canonical_text


def _texts(body: Any) -> tuple[str, str]:
    return json.dumps(body, allow_nan=False), json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False)


def _forget_row(key: int, _: weakref.ref[Any]) -> None:
    _ROW_TEXTS.pop(key, None)


def _row_texts(row: Any) -> tuple[str, str]:
    key = id(row)
    cached = _ROW_TEXTS.get(key)
    if cached is not None and cached[0]() is row:
        return cached[1], cached[2]
    texts = _texts(_plain_body(row))
    try:
        ref = weakref.ref(row, functools.partial(_forget_row, key))  # the texts go with the row
    except TypeError:  # a row that cannot be weakly referenced: made each time
        return texts
    _ROW_TEXTS[key] = (ref, *texts)
    return texts


def seal(key: str, schema: int, digest: str) -> str:
    """The HMAC-SHA256 of a checkpoint's schema and digest under `key` (hex)."""
    message = f"rl-checkpoint:{schema}:{digest}".encode()
    return hmac.new(key.encode(), message, hashlib.sha256).hexdigest()


class _NotPlain(Exception):
    """A value `_plain_body` leaves to the general path (`asdict`, `tag_non_finite`, `canonical`)."""


@functools.cache
def _field_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


def _plain_body(value: Any) -> Any:
    """`tag_non_finite(asdict(value))` in one pass, for dataclasses, lists, tuples, str-keyed dicts and scalars of
    exactly the builtin types; anything else raises `_NotPlain`.

    `asdict` deep-copies every leaf and was a third of a simulated GRPO scenario's checkpoint writes; what this
    returns is JSON whose canonical form is itself, so its digest needs no `canonical` pass either (`_plain_digest`).
    """
    kind: type = type(value)
    if kind is str or kind is int or kind is bool or value is None:
        return value
    if kind is float:
        return value if math.isfinite(value) else {"__float__": repr(value)}
    if kind is list or kind is tuple:
        return [_plain_body(v) for v in value]
    if kind is dict:
        if not all(type(k) is str for k in value):
            raise _NotPlain  # canonical() sorts keys by str(k), json by the keys themselves
        return {k: _plain_body(v) for k, v in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {name: _plain_body(getattr(value, name)) for name in _field_names(kind)}
    raise _NotPlain


def _plain_digest(body: Any) -> str:
    """`content_digest(body)` for JSON made of builtin types only (what `_plain_body` builds and `json.loads` returns).

    Such a value's canonical form is itself but for key order, which `sort_keys` gives, so the bytes hashed are the
    ones `content_digest` hashes. A non-finite float (which `json.loads` accepts) is left to `content_digest`.
    """
    try:
        payload = json.dumps([body], sort_keys=True, separators=(",", ":"), allow_nan=False)
    except ValueError:
        return content_digest(body)
    return json_digest(payload)


def decode_state(blob: bytes, source: str = "the driver checkpoint") -> DriverState:
    """The state `blob` holds, every field checked against its type and bounds (rl.storage.checkpoint.schema) before
    use; `CheckpointError` naming `source` and the field otherwise."""
    try:
        # Bare NaN tokens are admitted: checkpoints written before strict JSON hold them in history rows, and the
        # schema below refuses a non-finite value anywhere else.
        doc = parse_json(blob, allow_nan=True)
    except UntrustedValueError as exc:
        raise CheckpointCorruptError(
            f"{source} ({len(blob)} bytes) is not a checkpoint this tool wrote: {exc} (a torn write or a foreign "
            "file). Delete it to restart the run from iteration 0, or restore the previous checkpoint"
        ) from None
    if not isinstance(doc, dict) or "schema" not in doc or "state" not in doc or "digest" not in doc:
        raise CheckpointCorruptError(
            f"{source} is JSON but not a GRPO driver checkpoint (no schema/digest/state); "
            "point the run at its own checkpoint or delete this one to start from iteration 0"
        )
    if doc["schema"] != SCHEMA_VERSION or type(doc["schema"]) is not int:
        raise CheckpointSchemaError(
            f"{source} has schema {str(doc['schema'])[:40]!r}; this driver reads schema {SCHEMA_VERSION}. "
            "Resume it with the version of the package that wrote it, or start a new run."
        )
    if _plain_digest(doc["state"]) != doc["digest"]:
        raise CheckpointCorruptError(
            f"{source}'s digest does not match its contents (a partial or altered write); "
            "delete it to restart from iteration 0, or restore the previous checkpoint"
        )
    key = os.environ.get(RUN_KEY_ENV)
    if key:
        found = doc.get("seal")
        expected = seal(key, SCHEMA_VERSION, doc["digest"])
        if not isinstance(found, str) or not hmac.compare_digest(found, expected):
            raise CheckpointSealError(
                f"{source} is {'not sealed' if found is None else 'sealed with another key, or forged'}, and "
                f"{RUN_KEY_ENV} is set: only a checkpoint written with that key is resumed. Resume it with the key "
                f"that wrote it, unset {RUN_KEY_ENV} to trust it as it is, or start a new run"
            )
    state = untag_non_finite(doc["state"])
    try:
        validate(STATE, state, prefix="state")
    except UntrustedValueError as exc:
        raise CheckpointCorruptError(
            f"{source} is refused: {exc}. It was not written by this tool as it stands (its digest is a checksum "
            "anyone can recompute); delete it to restart from iteration 0, or restore the previous checkpoint"
        ) from None
    return DriverState.from_json(state)


def as_another_schema_version(blob: bytes) -> bytes:
    """`blob` as the next schema version would tag the same state (digest unchanged): the checkpoint an older package
    meets when a newer one wrote it, which it must refuse rather than misread. The conformance suite plants it."""
    doc = json.loads(blob)
    doc["schema"] = SCHEMA_VERSION + 1
    return json.dumps(doc, allow_nan=False).encode()


def as_altered(blob: bytes) -> bytes:
    """`blob` with its iteration changed after it was written and its digest left as it was: a partial or tampered
    write that still parses, which the driver must refuse rather than resume. The conformance suite plants it."""
    doc = json.loads(blob)
    iteration = doc["state"]["iteration"]
    doc["state"]["iteration"] = iteration - 1 if iteration > 0 else iteration + 1
    return json.dumps(doc, allow_nan=False).encode()
