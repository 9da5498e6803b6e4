"""peers/expected.toml is the one record of which laws each peer binding fails: `nox -s peers` reads it, and
docs/conformance.md shows it as rendered by `python -m peers.record`."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from peers import record

ROOT = Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- begin: python -m peers.record -->\n", "\n<!-- end: python -m peers.record -->"


def test_the_docs_table_of_expected_peer_failures_is_the_record_rendered():
    docs = (ROOT / "docs" / "conformance.md").read_text()
    shown = docs[docs.index(BEGIN) + len(BEGIN) : docs.index(END)]
    assert shown == record.markdown_table(), "docs/conformance.md is stale: paste `python -m peers.record` in"


def test_every_recorded_binding_exists_and_every_recorded_law_is_a_packaged_law():
    """A typo in the record would make `nox -s peers` fail for the wrong reason, minutes into an install."""
    suite = (ROOT / "rl" / "conformance").glob("*.py")
    laws = {name for path in suite for name in re.findall(r"def (test_\w+)\(", path.read_text())}
    for peer, spec in record.load().items():
        for binding, fails in spec["fails"].items():
            path = spec["module"][binding].replace(".", "/") + ".py"
            assert re.search(rf"\b{binding}\b", (ROOT / path).read_text()), f"{path} has no {binding}"
            assert {law.partition("::")[2].partition("[")[0] for law in fails} <= laws, (peer, binding, fails)
            assert spec["why"][binding].strip(), (peer, binding)


def test_a_record_missing_its_reason_is_refused(tmp_path):
    path = tmp_path / "expected.toml"
    path.write_text('[x]\npin = "x==1"\n[x.IMPL]\nfails = []\n')
    with pytest.raises(KeyError, match="why"):
        record.load(path)


def test_junit_outcomes_reads_passed_failed_errored_and_skipped_laws(tmp_path):
    report = tmp_path / "laws.xml"
    report.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="rl.conformance.test_suite.TestLoss" name="test_a"/>'
        '<testcase classname="rl.conformance.test_suite.TestLoss" name="test_b"><failure message="x"/></testcase>'
        '<testcase classname="rl.conformance.test_suite.TestAdvantages" name="test_c"><error message="x"/></testcase>'
        '<testcase classname="rl.conformance.test_suite.TestAdvantages" name="test_d"><skipped message="x"/></testcase>'
        "</testsuite></testsuites>"
    )
    assert record.junit_outcomes(str(report)) == {
        "TestLoss::test_a": "passed",
        "TestLoss::test_b": "failed",
        "TestAdvantages::test_c": "failed",
        "TestAdvantages::test_d": "skipped",
    }
