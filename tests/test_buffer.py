"""The rollout buffer on local volumes: the packaged buffer laws, then JSONL that pandas loads, partial reads, and
re-scoring into a new version."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rl.conformance import RolloutBufferContract
from rl.errors import IterationExistsError, IterationNotFoundError, RowSchemaError
from rl.storage.volumes import PANDAS_DTYPES, ROW_FIELDS, LocalVolumeStore, VolumeBuffer, rollout_rows
from rl.storage.volumes.buffer import encode_rows, iteration_file
from rl.types import Rollout

finite = st.floats(allow_nan=False, allow_infinity=False, width=64)


@st.composite
def rollouts(draw: st.DrawFn, group_id: int = 0) -> Rollout:
    """One rollout with arbitrary text (quotes, newlines, non-ASCII) and arbitrary finite log-probs."""
    n = draw(st.integers(0, 4))
    return Rollout(
        group_id=group_id,
        question=draw(st.text(max_size=12)),
        answer=draw(st.text(max_size=6)),
        completion=draw(st.text(max_size=12)),
        prompt_token_ids=draw(st.lists(st.integers(0, 50_000), max_size=4)),
        token_ids=draw(st.lists(st.integers(0, 50_000), min_size=n, max_size=n)),
        logprobs=draw(st.lists(finite, min_size=n, max_size=n)),
        policy_version=draw(st.integers(0, 100)),
        seed=draw(st.integers(0, 2**31 - 1)),
    )


def make_rollout(group_id: int, answer: str, completion: str, policy_version: int = 0) -> Rollout:
    return Rollout(
        group_id=group_id,
        question=f"what is {answer}?",
        answer=answer,
        completion=completion,
        prompt_token_ids=[1, 2, 3],
        token_ids=[4, 5],
        logprobs=[-0.25, -1.5],
        policy_version=policy_version,
        seed=group_id,
    )


def exact_match(rollout: Rollout) -> float:
    return 1.0 if rollout.completion.strip() == rollout.answer else 0.0


def format_only(rollout: Rollout) -> float:
    return 1.0 if rollout.completion.strip().isdigit() else 0.0


def iteration_rows(iteration: int) -> list[dict]:
    """Two groups of two: one right, one wrong, one well-formed but wrong, one malformed."""
    rs = [
        make_rollout(0, "42", "42", iteration),
        make_rollout(0, "42", "41", iteration),
        make_rollout(1, "7", "7", iteration),
        make_rollout(1, "7", "seven", iteration),
    ]
    return rollout_rows(iteration, rs, [exact_match(r) for r in rs])


@pytest.fixture
def buffer(tmp_path: Path) -> VolumeBuffer:
    return VolumeBuffer(LocalVolumeStore(tmp_path / "store"), "rollouts")


class TestLocalRolloutBuffer(RolloutBufferContract):
    """The packaged buffer laws on ours; the tests below add what only ours promises (pandas, sharing, messages)."""

    @pytest.fixture
    def rollout_buffer_factory(self, tmp_path: Path):
        return lambda: VolumeBuffer(LocalVolumeStore(tempfile.mkdtemp(dir=tmp_path), durable=False), "rollouts")


def test_the_jsonl_loads_with_pandas_read_json(buffer):
    """`pd.read_json(path, lines=True)` loads an iteration's file: one row per rollout, the buffer's columns."""
    v = buffer.append(3, iteration_rows(3))
    df = pd.read_json(buffer.path(v, 3), lines=True)
    assert list(df.columns) == list(ROW_FIELDS)
    assert len(df) == 4 and set(df["iteration"]) == {3}
    assert df["reward"].tolist() == [1.0, 0.0, 1.0, 0.0]
    assert df["logprobs"].tolist() == [[-0.25, -1.5]] * 4
    # pandas' dtype inference turns the numeric-looking answers into ints; PANDAS_DTYPES keeps them text.
    typed = pd.read_json(buffer.path(v, 3), lines=True, dtype=PANDAS_DTYPES)
    assert typed.to_dict("records") == iteration_rows(3)


@given(data=st.data())
def test_any_rows_round_trip_through_read_and_pandas(data):
    """Whatever the text and finite floats, `read` returns the rows appended bit for bit, and pandas with
    `precise_float=True` loads the same records (its default parser can be off in the 12th digit, and its precise one
    refuses subnormal numbers, so those are drawn only for `read`)."""
    iteration = data.draw(st.integers(0, 99_999))
    rs = data.draw(st.lists(rollouts(), min_size=1, max_size=4))
    rows = rollout_rows(iteration, rs, data.draw(st.lists(finite, min_size=len(rs), max_size=len(rs))))
    with tempfile.TemporaryDirectory() as tmp:
        buffer = VolumeBuffer(LocalVolumeStore(tmp, durable=False), "rollouts")
        v = buffer.append(iteration, rows)
        assert buffer.read(v) == rows
        floats = [x for r in rows for x in (r["reward"], *r["logprobs"])]
        if all(x == 0.0 or abs(x) >= sys.float_info.min for x in floats):
            frame = pd.read_json(buffer.path(v, iteration), lines=True, dtype=PANDAS_DTYPES, precise_float=True)
            assert frame.to_dict("records") == rows
        os.chmod(Path(tmp) / "versions", 0o755)  # TemporaryDirectory removes it as its owner, sealed or not


@given(data=st.data())
def test_a_row_holds_its_rollout_and_reward_exactly(data):
    """`rollout_rows`, the rollout buffer's row builder: each row is its rollout's fields, the iteration and the reward,
    every float bit for bit (a row builder that rounded rewards would round-trip its own rounded rows)."""
    iteration = data.draw(st.integers(0, 99_999))
    rs = data.draw(st.lists(rollouts(), min_size=1, max_size=4))
    rewards = data.draw(st.lists(finite, min_size=len(rs), max_size=len(rs)))
    rows = rollout_rows(iteration, rs, rewards)
    assert [row["reward"] for row in rows] == rewards
    assert [{k: v for k, v in row.items() if k not in ("iteration", "reward")} for row in rows] == [
        r.to_dict() for r in rs
    ]
    assert {row["iteration"] for row in rows} == {iteration}


def test_each_append_forks_the_previous_version_and_shares_its_files(buffer):
    """Version n holds iterations 1..n; version n-1 is unchanged, and the files they share are not copied."""
    v1 = buffer.append(1, iteration_rows(1))
    v2 = buffer.append(2, iteration_rows(2))
    assert buffer.versions() == [v1, v2] and buffer.head() == v2 and v2.parent == v1.version
    assert buffer.iterations(v1) == [1] and buffer.iterations(v2) == [1, 2]
    assert buffer.read(v1) == iteration_rows(1)
    assert buffer.read(v2) == iteration_rows(1) + iteration_rows(2)
    if buffer.store.share_mode == "hardlink":
        assert os.path.samefile(buffer.path(v1, 1), buffer.path(v2, 1))


def test_reading_one_iteration_opens_no_other_iterations_file(buffer):
    """With iteration 1's file destroyed, iteration 2 still reads; only a read that asks for 1 fails."""
    buffer.append(1, iteration_rows(1))
    v = buffer.append(2, iteration_rows(2))
    damaged = buffer.path(v, 1)
    os.chmod(damaged, 0o644)
    damaged.write_text("{not json\n")
    assert buffer.read(v, iterations=[2]) == iteration_rows(2)
    assert buffer.iterations(v) == [1, 2]  # listing reads the manifest, not the files
    with pytest.raises(RowSchemaError, match=r"iter-00001\.jsonl"):
        buffer.read(v, iterations=[1])


def test_reading_a_missing_iteration_says_what_the_version_holds(buffer):
    """Asking for an iteration the version lacks raises IterationNotFoundError listing the ones it has."""
    v = buffer.append(1, iteration_rows(1))
    with pytest.raises(IterationNotFoundError, match=r"has no iteration \[5\]; it holds \[1\]"):
        buffer.read(v, iterations=[1, 5])


def test_rescore_changes_rewards_keeps_completions_and_leaves_the_source_unchanged(buffer):
    """Re-scoring writes a new version: new rewards, identical rollouts; the scored version still reads as before."""
    buffer.append(1, iteration_rows(1))
    source = buffer.append(2, iteration_rows(2))
    original = buffer.read(source)
    new, stats = buffer.rescore(source, format_only)
    rescored = buffer.read(new)
    assert new != source and new.parent == source.version and buffer.head() == new
    assert buffer.read(source) == original
    assert [r["reward"] for r in original] == [1.0, 0.0, 1.0, 0.0] * 2
    assert [r["reward"] for r in rescored] == [1.0, 1.0, 1.0, 0.0] * 2
    assert [{**r, "reward": None} for r in rescored] == [{**r, "reward": None} for r in original]
    assert stats.generated == 0 and stats.rollouts_rescored == 8 and stats.changed == 2
    assert stats.mean_reward_before == 0.5 and stats.mean_reward_after == 0.75
    assert stats.buffer_version == new.version and stats.source_version == source.version
    assert stats.reward == "format_only" and stats.iterations == [1, 2]


def test_a_reward_function_returning_nan_publishes_nothing(buffer):
    """A non-finite reward stops the rescore with an error naming the function; no version is added."""
    v = buffer.append(1, iteration_rows(1))
    with pytest.raises(RowSchemaError, match="nan_reward returned nan"):
        buffer.rescore(v, lambda r: float("nan"), reward_name="nan_reward")
    assert buffer.versions() == [v]


@pytest.mark.parametrize("reward", ["1e999", "-1e999"])
def test_a_stored_row_with_an_infinite_reward_is_refused_on_read(buffer, reward):
    """A version whose file holds a reward that parses to infinity (`1e999` is valid JSON; only the schema refuses it),
    written past `append`'s check, reads as a `RowSchemaError` naming the field, never as rows to train on."""
    good = encode_rows(0, iteration_rows(0)).decode().splitlines()
    planted = good[0].replace('"reward": 1.0', f'"reward": {reward}')
    assert planted != good[0]
    with buffer.store.new(buffer.name) as rw:
        rw.write_bytes(iteration_file(0), "".join(f"{line}\n" for line in [planted, *good[1:]]).encode())
        version = rw.finalize("a row past append's check")
    with pytest.raises(RowSchemaError, match="reward"):
        buffer.read(version)


def test_a_retried_append_returns_the_same_version_and_a_different_one_is_refused(buffer):
    """Appending identical rows for a stored iteration is a no-op; different rows raise IterationExistsError."""
    v = buffer.append(1, iteration_rows(1))
    assert buffer.append(1, iteration_rows(1)) == v
    changed = [{**r, "reward": 0.5} for r in iteration_rows(1)]
    with pytest.raises(IterationExistsError, match="already holds iteration 1"):
        buffer.append(1, changed)
    assert buffer.versions() == [v]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda r: {k: v for k, v in r.items() if k != "logprobs"}, "lacks \\['logprobs'\\]"),
        (lambda r: {**r, "iteration": 9}, "says iteration 9"),
        (lambda r: {**r, "reward": float("inf")}, "rewards are finite numbers"),
        (lambda r: {**r, "reward": True}, "rewards are finite numbers"),
        (lambda r: {**r, "logprobs": [float("nan")]}, "not plain finite JSON"),
    ],
)
def test_rows_outside_the_schema_are_refused(buffer, change, message):
    """Rows must carry every field, this iteration and finite numbers, so every stored file loads the same way."""
    rows = iteration_rows(1)
    with pytest.raises(RowSchemaError, match=message):
        buffer.append(1, [change(rows[0]), *rows[1:]])
    assert buffer.versions() == []


def test_a_rollouts_dict_has_every_field_as_asdict_gives_it() -> None:
    """`Rollout.to_dict` is spelled out for speed; a field added to `Rollout` must not go missing from buffer rows."""
    import dataclasses

    from rl.types import Rollout

    rollout = Rollout(1, "3=", "4", "4", [1, 2], [3, 4], [-0.5, -0.25], 2, 7)
    assert rollout.to_dict() == dataclasses.asdict(rollout)
    assert Rollout.from_dict(rollout.to_dict()) == rollout
