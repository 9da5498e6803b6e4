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

import hashlib
import hmac
import json
import os
import re
from dataclasses import dataclass, field, replace
from typing import Any

from rl.errors import CheckpointCorruptError, CheckpointSchemaError, CheckpointSealError, UntrustedValueError
from rl.identity import RECORDED_AS, canonical, content_digest, json_digest, recorded_dict
from rl.storage.checkpoint.schema import STATE
from rl.strict_json import dumps, tag_non_finite, untag_non_finite
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
    policy_version: int = field(metadata={RECORDED_AS: "adapter_version"})  # checkpoint schema 1's name
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
        return recorded_dict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> DriverState:
        pending = d.get("pending_eval")
        previous = d.get("previous_adapter")
        return cls(
            config_digest=d["config_digest"],
            iteration=d["iteration"],
            adapter=ArtifactRef(**d["adapter"]),
            policy_version=d["adapter_version"],
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
    """The checkpoint of `state` (a run writing one an iteration keeps a `CheckpointEncoder`: it encodes a row once)."""
    return CheckpointEncoder().encode(state)


_ROW_LISTS = ("history", "evals")  # the fields that grow by a row an iteration
# Where each row list goes while the rest of the state is encoded: a string no checkpoint field holds (checked).
_MARKS = {name: f"\x00rl-checkpoint-rows:{name}\x00" for name in _ROW_LISTS}
_MARK_TEXTS = {dumps(mark): name for name, mark in _MARKS.items()}
_MARK_PATTERN = re.compile("|".join(re.escape(text) for text in _MARK_TEXTS))


@dataclass(frozen=True)
class _EncodedRow:
    row: Any
    text: str  # strict JSON of the row's tagged body, as the checkpoint holds it
    canonical: str  # its canonical form (sorted keys, no spaces), as the digest hashes it


def _encode_row(row: Any) -> _EncodedRow:
    body = tag_non_finite(recorded_dict(row))
    return _EncodedRow(row, dumps(body), _canonical_text(body))


def _canonical_text(body: Any) -> str:
    """The text `content_digest(body)` hashes, less its enclosing `[` `]`."""
    return dumps(canonical(body), sort_keys=True, separators=(",", ":"))


class CheckpointEncoder:
    """A run's checkpoints as bytes: `{"schema": N, "digest": content_digest(body), "state": body}` in strict JSON,
    where `body` is the state as recorded (`recorded_dict`) with each non-finite float as {"__float__": "nan"} (the
    form the digest hashes it in, so a resume restores the exact value).

    The history and eval rows append: each row is encoded once, when a checkpoint first holds it, and kept while the
    states that follow hold the same row (rows are frozen; a list grown by appending shares them). Encoding every row
    again each iteration made a run's checkpoints quadratic in its length. The rest of the state is encoded with a
    mark in each row list's place, which the rows' texts then replace: JSON writes a list's items between `[` and `]`,
    joined by ", " (by "," in the digest's canonical form), so the bytes are those of the whole body encoded at once.
    """

    def __init__(self) -> None:
        self._rows: dict[str, list[_EncodedRow]] = {name: [] for name in _ROW_LISTS}

    def encode(self, state: DriverState) -> bytes:
        lists = {name: getattr(state, name) for name in _ROW_LISTS}
        if all(type(rows) is list for rows in lists.values()):
            for name, rows in lists.items():
                written = self._rows[name]
                self._rows[name] = [
                    written[i] if i < len(written) and written[i].row is row else _encode_row(row)
                    for i, row in enumerate(rows)
                ]
            blob = self._spliced(state)
            if blob is not None:
                return blob
        body = tag_non_finite(state.to_json())  # a row list of another type, or a mark in a field: all at once
        return _document(body, content_digest(body)).encode()

    def _spliced(self, state: DriverState) -> bytes | None:
        body = tag_non_finite(recorded_dict(replace(state, history=[], evals=[])))  # _ROW_LISTS, filled in below
        body.update(_MARKS)  # the same keys, so the fields keep their order
        canonical_text = _splice(f"[{_canonical_text(body)}]", {k: self._joined(k, compact=True) for k in _MARKS})
        if canonical_text is None:
            return None
        text = _splice(_document(body, json_digest(canonical_text)), {k: self._joined(k) for k in _MARKS})
        return None if text is None else text.encode()

    def _joined(self, name: str, compact: bool = False) -> str:
        rows = self._rows[name]
        if compact:
            return "[" + ",".join(row.canonical for row in rows) + "]"
        return "[" + ", ".join(row.text for row in rows) + "]"


def _document(body: Any, digest: str) -> str:
    doc: dict[str, Any] = {"schema": SCHEMA_VERSION, "digest": digest, "state": body}
    key = os.environ.get(RUN_KEY_ENV)
    if key:
        doc["seal"] = seal(key, SCHEMA_VERSION, digest)
    return dumps(doc)


def _splice(text: str, lists: dict[str, str]) -> str | None:
    """`text` with each row list's mark replaced by the list's text; None unless each mark is there exactly once."""
    found = sorted(_MARK_TEXTS[m] for m in _MARK_PATTERN.findall(text))
    if found != sorted(lists):
        return None
    return _MARK_PATTERN.sub(lambda m: lists[_MARK_TEXTS[m.group()]], text)


def seal(key: str, schema: int, digest: str) -> str:
    """The HMAC-SHA256 of a checkpoint's schema and digest under `key` (hex)."""
    message = f"rl-checkpoint:{schema}:{digest}".encode()
    return hmac.new(key.encode(), message, hashlib.sha256).hexdigest()


def _plain_digest(body: Any) -> str:
    """`content_digest(body)` for JSON made of builtin types only (what `json.loads` returns).

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
