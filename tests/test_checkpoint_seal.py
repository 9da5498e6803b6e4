"""With `RL_RUN_KEY` set, a checkpoint is sealed (HMAC-SHA256 over its schema and digest) and only a sealed one
resumes: a digest anyone can recompute proves nothing about who wrote the file, a seal does."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from rl.errors import CheckpointSealError
from rl.identity import content_digest
from rl.storage.checkpoint.format import RUN_KEY_ENV, DriverState, decode_state, encode_state
from rl.types import ArtifactRef


def _state(iteration: int = 3) -> DriverState:
    ref = ArtifactRef(uri="mem://adapter", digest="d")
    return replace(DriverState.initial("c" * 32, ref, ref), iteration=iteration, policy_version=iteration + 1)


def _forge(blob: bytes, **fields: object) -> bytes:
    """`blob` with state fields changed and the digest recomputed, keeping whatever seal it had."""
    doc = json.loads(blob)
    doc["state"].update(fields)
    doc["digest"] = content_digest(doc["state"])
    return json.dumps(doc).encode()


def test_a_sealed_checkpoint_round_trips_under_its_key(monkeypatch):
    monkeypatch.setenv(RUN_KEY_ENV, "team-secret")
    blob = encode_state(_state())
    assert "seal" in json.loads(blob)
    assert decode_state(blob) == _state()


def test_with_a_key_a_forged_checkpoint_is_refused_though_its_digest_verifies(monkeypatch):
    """Someone without the key edits the iteration and recomputes the digest: the seal no longer verifies."""
    monkeypatch.setenv(RUN_KEY_ENV, "team-secret")
    forged = _forge(encode_state(_state()), iteration=99)
    with pytest.raises(CheckpointSealError, match="forged") as info:
        decode_state(forged, "run/checkpoint.json")
    assert info.value.exit_code == 3 and "run/checkpoint.json" in str(info.value)


def test_with_a_key_an_unsealed_or_otherwise_sealed_checkpoint_is_refused(monkeypatch):
    unsealed = encode_state(_state())
    monkeypatch.setenv(RUN_KEY_ENV, "other-key")
    sealed_elsewhere = encode_state(_state())
    monkeypatch.setenv(RUN_KEY_ENV, "team-secret")
    with pytest.raises(CheckpointSealError, match="not sealed"):
        decode_state(unsealed)
    with pytest.raises(CheckpointSealError, match="another key"):
        decode_state(sealed_elsewhere)


def test_without_a_key_a_sealed_checkpoint_still_resumes(monkeypatch):
    """The seal is checked only where there is a key to check it with; the digest still catches a torn write."""
    monkeypatch.setenv(RUN_KEY_ENV, "team-secret")
    blob = encode_state(_state())
    monkeypatch.delenv(RUN_KEY_ENV)
    assert decode_state(blob) == _state()
