"""peers/history.toml is the one record of released bugs found again: `nox -s peers-history` replays it, and
docs/conformance.md shows it as rendered by `python -m peers.history_record`."""

from __future__ import annotations

from pathlib import Path

import pytest

import rl.conformance.test_suite as suite
from peers import history_record

ROOT = Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- begin: python -m peers.history_record -->\n", "\n<!-- end: python -m peers.history_record -->"
GOOD = """
[lib_pr1]
report = "https://example.org/lib/pull/1"
title = "a bug"
law = "TestScorer::test_scorer_returns_one_finite_reward_per_rollout"
binding = "peers.history.lib_pr1:IMPL"
before = "lib==1.0"
after = "lib==1.1"
why = "it broke"
"""


def test_the_docs_table_of_released_bugs_is_the_record_rendered():
    docs = (ROOT / "docs" / "conformance.md").read_text()
    shown = docs[docs.index(BEGIN) + len(BEGIN) : docs.index(END)]
    assert shown == history_record.markdown_table(), (
        "docs/conformance.md is stale: paste `python -m peers.history_record` in"
    )


def test_every_recorded_bug_names_a_packaged_law_and_a_binding_module_that_exist():
    """A typo in the record would make `nox -s peers-history` fail for the wrong reason, minutes into two installs."""
    for bug, spec in history_record.load().items():
        cls, _, test = spec["law"].partition("::")
        assert callable(getattr(getattr(suite, cls, None), test, None)), (
            f"[{bug}] rl.conformance.test_suite: {cls}::{test}?"
        )
        path = history_record.binding_path(spec, ROOT)
        assert path.is_file(), f"[{bug}] binding {spec['binding']}: no {path.relative_to(ROOT)}"
        attr = spec["binding"].partition(":")[2]
        assert f"\n{attr} = " in path.read_text() or f"\n{attr}: " in path.read_text(), f"[{bug}] {path.name}: {attr}?"
        assert all("==" in pin for pin in spec["with"]), f"[{bug}] `with` pins exact versions: {spec['with']}"


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (lambda text: text.replace('why = "it broke"\n', ""), r"lacks \['why'\]"),
        (lambda text: text + 'extra = "x"\n', r"unknown fields \['extra'\]"),
        (lambda text: text.replace("TestScorer::", "TestScorer."), "is not `TestClass::test_name`"),
        (lambda text: text.replace("peers.history.lib_pr1:IMPL", "peers.lib_pr1"), "is not peers.history"),
        (lambda text: text.replace('"lib==1.0"', '"lib>=1.0"'), "before = 'lib>=1.0' is not an exact"),
    ],
)
def test_a_malformed_record_is_refused_naming_the_bug_and_the_field(tmp_path, edit, match):
    path = tmp_path / "history.toml"
    path.write_text(GOOD)
    assert list(history_record.load(path)) == ["lib_pr1"]
    path.write_text(edit(GOOD))
    with pytest.raises(history_record.HistoryRecordError, match=match):
        history_record.load(path)


def _report(tmp_path: Path, cases: str) -> str:
    path = tmp_path / "law.xml"
    path.write_text(f'<testsuites><testsuite name="pytest">{cases}</testsuite></testsuites>')
    return str(path)


def test_a_law_fails_when_any_of_its_cases_fails_and_passes_only_when_all_pass(tmp_path):
    law = "TestScorer::test_x"
    case = '<testcase classname="rl.conformance.test_suite.TestScorer" name="test_x{}">{}</testcase>'
    other = case.replace("test_x{}", "test_xy{}")
    failed = _report(tmp_path, case.format("[a]", "") + case.format("[b]", '<failure message="m"/>'))
    assert history_record.law_outcome(failed, law) == "failed"
    passed = _report(tmp_path, case.format("[a]", "") + other.format("", '<failure message="m"/>'))
    assert history_record.law_outcome(passed, law) == "passed"  # test_xy is another law
    skipped = _report(tmp_path, case.format("", '<skipped message="m"/>'))
    assert history_record.law_outcome(skipped, law).startswith("skipped")
    assert history_record.law_outcome(_report(tmp_path, ""), law).startswith("not run")


def test_the_verdict_names_the_bug_and_each_side_whose_outcome_differs(tmp_path):
    path = tmp_path / "history.toml"
    path.write_text(GOOD)
    spec = history_record.load(path)["lib_pr1"]
    assert history_record.verdict("lib_pr1", spec, {"before": "failed", "after": "passed"}) == []
    [message] = history_record.verdict("lib_pr1", spec, {"before": "passed", "after": "passed"})
    assert message.startswith("lib_pr1 (https://example.org/lib/pull/1): before (lib==1.0) was expected to have failed")
    before, after = history_record.verdict("lib_pr1", spec, {"before": "passed"})
    assert "before (lib==1.0)" in before and "but it passed" in before
    assert "after (lib==1.1)" in after and "but it did not run" in after
