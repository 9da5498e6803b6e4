"""The checkpoint's bytes are its format: an encoder that writes each row once must write exactly what the formula
writes for the whole state (`asdict`, `tag_non_finite`, `content_digest`), so checkpoints written before it resume,
and vice versa.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rl.identity import content_digest
from rl.storage.checkpoint.format import DriverState, decode_state, encode_state
from rl.strict_json import tag_non_finite
from rl.types import ArtifactRef, EvalResult, IterationMetrics


def _formula(state: DriverState) -> bytes:
    """The checkpoint as schema 1 defines it: the tagged `asdict` body, its content digest, as strict JSON. Schema 1
    names the state's and each row's `policy_version` `adapter_version`, in the same place."""
    body = tag_non_finite(_schema1_names(asdict(state)))
    body["history"] = [_schema1_names(row) for row in body["history"]]
    return json.dumps({"schema": 1, "digest": content_digest(body), "state": body}, allow_nan=False).encode()


def _schema1_names(d: dict[str, Any]) -> dict[str, Any]:
    return {("adapter_version" if k == "policy_version" else k): v for k, v in d.items()}


class _Float(float):
    """A float subclass (numpy's float64 is one), which the encoder must write as `json.dumps` writes it."""


_floats = st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from([0.0, -0.0, 5e-324, 1.7e308])
_text = st.text(max_size=8)
# What the driver writes, and so what a checkpoint's schema admits (rl.storage.checkpoint.schema): counts are
# non-negative, timings finite, held-out rates in [0, 1].
_counts = st.integers(0, 10**12)
_rates = st.floats(0.0, 1.0)
_timings = st.dictionaries(_text, st.floats(allow_nan=False, allow_infinity=False), max_size=3)


@st.composite
def _rows(draw: st.DrawFn, iteration: int) -> IterationMetrics:
    metrics = st.dictionaries(_text, _floats, max_size=3)
    return IterationMetrics(
        iteration=iteration,
        policy_version=iteration + 1,
        num_rollouts=draw(_counts),
        mean_reward=draw(_floats),
        max_reward=draw(_floats),
        mean_loss=draw(_floats),
        contributing=draw(st.integers(0, 64)),
        sample_question=draw(_text),
        sample_completion=draw(_text),
        sample_reward=draw(_floats),
        extra=draw(metrics),
        kl=draw(_floats),
        grad_norm=draw(_floats),
        task_metrics=draw(metrics),
        phase_s=draw(_timings),
    )


@st.composite
def _states(draw: st.DrawFn) -> DriverState:
    ref = ArtifactRef(uri=draw(_text), digest=draw(_text))
    n = draw(st.integers(0, 3))
    evals = [EvalResult(v, 4, draw(_rates), draw(_rates), 8) for v in range(draw(st.integers(0, 2)))]
    config: dict[str, Any] = {"iterations": n, "pipelined": draw(st.booleans()), "name": draw(_text), "x": None}
    return replace(
        DriverState.initial("c" * 32, ref, ref),
        iteration=n - 1,
        policy_version=n,
        history=[draw(_rows(i)) for i in range(n)],
        evals=evals,
        previous_adapter=draw(st.none() | st.just(ref)),
        pending_eval=draw(st.none() | st.just((ref, n))),
        buffer_version=draw(st.none() | _text),
        config=config,
    )


def _same(a: Any, b: Any) -> bool:
    """Equal, with NaN equal to NaN (a restored NaN loss is still NaN)."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


@pytest.mark.heavy
@settings(max_examples=200)
@given(st.data())
def test_the_checkpoint_bytes_are_the_formulas_and_decode_back(data):
    state = data.draw(_states())
    blob = encode_state(state)
    assert blob == _formula(state)
    assert _same(decode_state(blob).to_json(), state.to_json())


@given(st.data())
def test_values_of_other_types_take_the_general_path_to_the_same_bytes(data):
    """A float subclass, an int key, a tuple in a dict: each written as the formula writes it."""
    state = data.draw(_states())
    odd = data.draw(
        st.sampled_from(
            [
                {"n": _Float(0.5), "m": _Float(math.inf)},
                {2: 1.0, 10: 2.0},  # canonical() sorts these as "10" < "2", json by value
                {"t": (1.0, math.nan)},
            ]
        )
    )
    state = replace(state, config={**(state.config or {}), "odd": odd})
    assert encode_state(state) == _formula(state)


def test_a_checkpoint_whose_digest_covers_nan_tokens_still_verifies():
    """A legacy blob holds `NaN` tokens; the fast digest check hands it to `content_digest`, which tags them."""
    ref = ArtifactRef(uri="mem://adapter", digest="d")
    state = replace(DriverState.initial("c" * 32, ref, ref), config={"lr": math.nan})
    body = _schema1_names(asdict(state))
    legacy = json.dumps({"schema": 1, "digest": content_digest(body), "state": body}).encode()
    assert b"NaN" in legacy
    assert math.isnan(decode_state(legacy).config["lr"])  # type: ignore[index]


@given(st.data())
def test_a_growing_history_writes_the_formulas_bytes_at_every_length(data):
    """The driver's checkpoints share their rows: each row's text is made once, and every checkpoint is still the
    formula's, whichever rows are the earlier objects, new equal objects, or rows replaced by others."""
    state = data.draw(_states())
    rows = list(state.history)
    for _ in range(3):
        assert encode_state(state) == _formula(state)
        extra = data.draw(_rows(len(rows)))
        rows = [*rows[: data.draw(st.integers(0, len(rows)))], extra]  # a prefix kept (a resume), one row added
        if rows and data.draw(st.booleans()):
            rows[0] = replace(rows[0], sample_question=rows[0].sample_question + "?")  # an edited row is a new one
        state = replace(state, history=list(rows), evals=[*state.evals, EvalResult(len(rows), 4, 0.5, 0.25, 8)])
    assert encode_state(state) == _formula(state)


def test_a_row_of_another_type_in_the_history_takes_the_general_path():
    ref = ArtifactRef(uri="mem://adapter", digest="d")
    row = IterationMetrics(0, 1, 8, 0.5, 1.0, 0.1, 8, "q", "c", 1.0, extra={"odd": _Float(0.5)})
    state = replace(DriverState.initial("c" * 32, ref, ref), iteration=0, policy_version=1, history=[row])
    assert encode_state(state) == _formula(state)


def test_each_checkpoint_encodes_only_the_rows_it_adds(monkeypatch):
    """Re-encoding every row each iteration made a run's checkpoints quadratic in its length: a run's encoder encodes
    each row once, and a row replaced (an evaluation's seconds noted on it) again."""
    from rl.storage.checkpoint import format as fmt

    ref = ArtifactRef(uri="mem://adapter", digest="d")
    state = DriverState.initial("c" * 32, ref, ref)
    encoder = fmt.CheckpointEncoder()
    encoded: list[Any] = []
    encode_row = fmt._encode_row
    monkeypatch.setattr(fmt, "_encode_row", lambda row: encoded.append(row) or encode_row(row))
    for i in range(50):
        row = IterationMetrics(i, i + 1, 8, 0.5, 1.0, 0.1, 8, "q", "c", 1.0, phase_s={"train": 0.1})
        state = replace(state, iteration=i, policy_version=i + 1, history=[*state.history, row])
        if i % 7 == 6:  # an earlier row replaced, as `with_eval_time` does
            timed = replace(state.history[i - 1], phase_s={"train": 0.1, "evaluate": 0.2})
            state = replace(state, history=[*state.history[: i - 1], timed, row])
        before = len(encoded)
        assert encoder.encode(state) == _formula(state)
        changed = [r.iteration for r in state.history if r is row or (i % 7 == 6 and r.iteration == i - 1)]
        assert sorted(r.iteration for r in encoded[before:]) == changed


@given(st.data())
def test_a_runs_encoder_writes_the_formulas_bytes_whatever_its_states_share(data):
    """One encoder across states that share rows, replace them, drop them (a resume) or hold other types."""
    from rl.storage.checkpoint.format import CheckpointEncoder

    encoder = CheckpointEncoder()
    state = data.draw(_states())
    for _ in range(4):
        assert encoder.encode(state) == _formula(state)
        rows = list(state.history)
        rows = [*rows[: data.draw(st.integers(0, len(rows)))], data.draw(_rows(len(rows)))]
        if data.draw(st.booleans()):
            rows[0] = replace(rows[0], extra={"odd": _Float(math.nan)})
        state = replace(state, history=rows, evals=[*state.evals, EvalResult(len(rows), 4, 0.5, 0.25, 8)])
    assert encoder.encode(state) == _formula(state)


def test_a_field_holding_a_row_lists_mark_is_still_written_as_the_formula():
    """The rest of the state is encoded with a mark where each row list goes; a field that holds the mark itself
    must not be mistaken for it."""
    from rl.storage.checkpoint.format import _MARKS

    ref = ArtifactRef(uri="mem://adapter", digest="d")
    row = IterationMetrics(0, 1, 8, 0.5, 1.0, 0.1, 8, _MARKS["evals"], "c", 1.0)
    state = replace(DriverState.initial("c" * 32, ref, ref), iteration=0, policy_version=1, history=[row])
    for config in ({"name": _MARKS["history"]}, {_MARKS["evals"]: 1}, {"name": "plain"}):
        assert encode_state(replace(state, config=config)) == _formula(replace(state, config=config))
