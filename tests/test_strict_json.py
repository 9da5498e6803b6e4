"""Every JSON the project writes is strict: no `NaN` or `Infinity`, which strict parsers reject (issue 16, item 7).

A huge finite reward keeps the means finite; a non-finite value that does occur (a diverged loss) is written as null and
named in the row's `non_finite` (metrics.jsonl, `--json` lines), tagged exactly in the checkpoint, or refused with an
error naming its field. A scan of rl/ and fakes/ finds no `json.dump`/`json.dumps` without `allow_nan=False`.
"""

from __future__ import annotations

import ast
import asyncio
import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from parsed_sources import walked

from rl.deploy.file_reporter import FileReporter
from rl.errors import NonFiniteMetricError
from rl.loop.grpo import iteration_metrics
from rl.storage.checkpoint.format import DriverState, decode_state, encode_state
from rl.storage.volumes.buffer import VolumeBuffer, rollout_rows
from rl.storage.volumes.store import LocalVolumeStore
from rl.strict_json import dumps, flag_non_finite, unflag_non_finite
from rl.types import ArtifactRef, IterationMetrics, Rollout, StepMetrics

REPO = Path(__file__).resolve().parents[1]


def _strict_loads(text: str) -> Any:
    """`json.loads` as a strict parser (JavaScript's JSON.parse, jq) reads: NaN, Infinity and -Infinity are errors."""

    def refuse(token: str) -> Any:
        raise ValueError(f"strict JSON has no {token}")

    return json.loads(text, parse_constant=refuse)


def _rollout(group: int = 0, sample: int = 0) -> Rollout:
    return Rollout(group, "1 + 1 =", "2", "####2", [3, 4], [1, 2], [-0.5, -0.5], 0, sample)


def _row(**overrides: Any) -> IterationMetrics:
    base = IterationMetrics(
        iteration=0,
        policy_version=1,
        num_rollouts=2,
        mean_reward=0.5,
        max_reward=1.0,
        mean_loss=0.1,
        contributing=2,
        sample_question="1 + 1 =",
        sample_completion="####2",
        sample_reward=1.0,
        task_metrics={"accuracy": 0.5},
    )
    return replace(base, **overrides)


def _same(a: Any, b: Any) -> bool:
    """Equality that counts NaN equal to NaN (a restored NaN is the value that was written)."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


finite_floats = st.floats(allow_nan=False, allow_infinity=False)


def _metrics_row(rewards: list[float]) -> IterationMetrics:
    return iteration_metrics(
        0,
        1,
        [_rollout(0, i) for i in range(len(rewards))],
        rewards,
        StepMetrics(loss=0.0, contributing=len(rewards), skipped_zero_advantage=0),
        max_staleness=0,
        task_metrics={},
        phase_s={},
    )


def test_two_rewards_of_1e308_average_to_1e308_not_infinity():
    """The issue's case: `sum(rewards) / n` overflowed, and metrics.jsonl held `Infinity`."""
    row = _metrics_row([1e308, 1e308])
    assert row.mean_reward == 1e308
    _strict_loads(dumps(row.to_dict()))


@given(data=st.data())
def test_mean_reward_of_finite_rewards_is_finite_and_within_their_range_however_large(data):
    """The mean of finite numbers lies within [min, max], however close to the largest float they are."""
    huge = st.sampled_from([1.7976931348623157e308, -1.7976931348623157e308, 1e308])
    rewards = data.draw(st.lists(finite_floats | huge, min_size=2, max_size=16), label="rewards")
    row = _metrics_row(rewards)
    assert math.isfinite(row.mean_reward) and min(rewards) <= row.mean_reward <= max(rewards)
    _strict_loads(dumps(row.to_dict()))


def test_rescoring_huge_rewards_reports_finite_means(tmp_path):
    """`math.fsum` raised OverflowError for rewards summing past the largest float; the means are now finite."""
    buffer = VolumeBuffer(LocalVolumeStore(tmp_path), "rollouts")
    buffer.append(0, rollout_rows(0, [_rollout(0, 0), _rollout(0, 1)], [1.7e308, 1.7e308]))
    _, stats = buffer.rescore(buffer.head(), lambda rollout: -1.7e308)
    assert (stats.mean_reward_before, stats.mean_reward_after) == (1.7e308, -1.7e308)
    _strict_loads(dumps(stats.to_dict()))


@pytest.mark.heavy
def test_metrics_jsonl_is_strict_json_with_non_finite_fields_null_and_named(tmp_path):
    """A diverged step's infinite grad norm and NaN loss: null in the row, named in `non_finite`, restored on load."""
    reporter = FileReporter(tmp_path, min_interval_s=3600.0)
    rows = [_row(), _row(iteration=1, grad_norm=math.inf, mean_loss=math.nan, task_metrics={"accuracy": -math.inf})]
    asyncio.run(reporter.publish(rows, status="running"))
    lines = [_strict_loads(line) for line in reporter.metrics_path.read_text().splitlines()]
    assert "non_finite" not in lines[0]
    assert lines[1]["grad_norm"] is None and lines[1]["mean_loss"] is None
    assert lines[1]["non_finite"] == {"grad_norm": "inf", "mean_loss": "nan", "task_metrics.accuracy": "-inf"}
    restored = [IterationMetrics.from_dict(line) for line in lines]
    assert _same([r.to_dict() for r in restored], [r.to_dict() for r in rows])


def test_the_checkpoint_is_strict_json_and_restores_non_finite_values_exactly():
    ref = ArtifactRef(uri="mem://adapter", digest="d")
    state = replace(
        DriverState.initial("c" * 32, ref, ref),
        iteration=1,
        history=[_row(), _row(iteration=1, kl=math.nan, grad_norm=-math.inf)],
    )
    blob = encode_state(state)
    _strict_loads(blob.decode())
    assert _same(decode_state(blob).to_json(), state.to_json())


def test_a_checkpoint_written_with_nan_tokens_before_this_change_still_loads():
    """Older checkpoints hold `NaN` tokens; their digest is over the same canonical form, so they still resume."""
    from rl.identity import content_digest

    ref = ArtifactRef(uri="mem://adapter", digest="d")
    state = replace(DriverState.initial("c" * 32, ref, ref), iteration=0, history=[_row(kl=math.nan)])
    body = state.to_json()
    legacy = json.dumps({"schema": 1, "digest": content_digest(body), "state": body}).encode()
    assert b"NaN" in legacy
    assert math.isnan(decode_state(legacy).history[0].kl)


def test_a_strict_dump_refuses_a_non_finite_value_naming_its_field():
    with pytest.raises(NonFiniteMetricError, match=r"runs\.1\.loss is inf"):
        dumps({"runs": [{"loss": 0.5}, {"loss": math.inf}]})


json_trees = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=4),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text("abc_", min_size=1, max_size=3), children, max_size=3)
    ),
    max_leaves=12,
)


@given(data=st.data())
def test_flagging_non_finite_values_gives_strict_json_that_unflags_to_the_same_row(data):
    """`unflag(loads(dumps(flag(row)))) == row` for any row, NaN and infinities at any depth included."""
    row = data.draw(st.dictionaries(st.text("xyz", min_size=1, max_size=3), json_trees, max_size=4), label="row")
    text = json.dumps(flag_non_finite(row), allow_nan=False)
    assert _same(unflag_non_finite(_strict_loads(text)), row)


def _json_writes(path: Path) -> list[tuple[int, bool]]:
    """Each `json.dump(...)`/`json.dumps(...)` call in a file: its line, and whether it passes allow_nan=False."""
    calls = []
    for node in walked(path):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("dump", "dumps")
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "json"
        ):
            strict = any(
                kw.arg == "allow_nan" and isinstance(kw.value, ast.Constant) and kw.value.value is False
                for kw in node.keywords
            )
            calls.append((node.lineno, strict))
    return calls


def test_every_json_write_in_rl_and_fakes_passes_allow_nan_false():
    """The law behind the others: no writer in the package can emit NaN or Infinity tokens."""
    files = sorted((REPO / "rl").rglob("*.py")) + sorted((REPO / "fakes").rglob("*.py"))
    writes = {path.relative_to(REPO).as_posix(): _json_writes(path) for path in files}
    assert sum(len(calls) for calls in writes.values()) >= 15  # the scan sees the writers it is meant to check
    lax = [f"{name}:{line}" for name, calls in writes.items() for line, strict in calls if not strict]
    assert lax == [], f"json.dump(s) without allow_nan=False (use it, or rl.strict_json): {lax}"
