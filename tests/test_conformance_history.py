"""The replay law's recorded history: the shipped file is what our driver issues, and a bad file fails loudly."""

from __future__ import annotations

import json

import pytest

from rl.conformance.recorded_history import load_history, record_history, reference_history, replay_violations
from rl.errors import HistoryFileError
from rl.loop.grpo import run_grpo


def test_the_shipped_history_is_what_our_driver_issues_today():
    """A change to run_grpo that re-keys its actions fails here first: re-record the file only on purpose."""
    fresh = record_history(run_grpo, recorded_with="rl.loop.grpo:run_grpo")
    assert reference_history() == fresh, (
        "run_grpo no longer issues the actions recorded in rl/conformance/data/grpo_history.json: in-flight runs "
        "would not resume under it. If deliberate: python -m rl.conformance.recorded_history --out "
        "rl/conformance/data/grpo_history.json"
    )


def test_a_history_round_trips_through_its_json():
    history = reference_history()
    assert load_history(history.to_json(), source="round trip") == history
    assert all(len(actions) > 10 for actions in history.actions.values())


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("not json", "is not a recorded history"),
        (json.dumps({"schema": 99, "config": {}, "actions": {}}), "schema 99"),
        (
            json.dumps({"schema": 1, "config": {}, "actions": {"sequential": []}}),
            r"no recorded actions for \['pipelined'\]",
        ),
    ],
)
def test_a_bad_history_file_says_what_is_wrong_and_how_to_re_record(text, match):
    with pytest.raises(HistoryFileError, match=match) as caught:
        load_history(text, source="my.json")
    assert "python -m rl.conformance.recorded_history" in str(caught.value)


RECORDED = [("a", "1"), ("b", "2"), ("b", "3"), ("c", "4")]


def test_replay_ignores_issue_order_but_names_the_first_unknown_action():
    assert replay_violations(RECORDED, [("a", "1"), ("b", "3"), ("b", "2"), ("c", "4")]) == []
    (problem,) = replay_violations(RECORDED, [("a", "1"), ("b", "9"), ("b", "3"), ("c", "4")])
    assert problem.startswith("action #1: the driver issued b (9)") and "the record has b (2) there" in problem


def test_replay_counts_repeats_and_reports_actions_never_issued():
    (twice,) = replay_violations(RECORDED, [("a", "1"), ("a", "1")])
    assert twice.startswith("action #1: the driver issued a (1)")
    (missing,) = replay_violations(RECORDED, RECORDED[:2])
    assert "never issued 2 recorded action(s), first b (3)" in missing
