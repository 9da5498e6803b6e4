"""Run the packaged conformance suite against one implementation, in process, and say which laws failed.

The self-test's only way in is the one a fork uses: `pytest --pyargs rl.conformance.test_suite --rl-impl MODULE:ATTR`,
from a directory without our conftest.py (pytester's), so a broken implementation is caught by the suite as shipped.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class SuiteRun:
    """The laws (test function names, parameters included) by outcome, and each failed law's report text."""

    failed: frozenset[str]
    passed: frozenset[str]
    skipped: frozenset[str]
    errors: frozenset[str]
    """Laws that broke outside their bodies (a fixture or the binding raised): also in `failed`."""
    reports: dict[str, str]
    """Per failed law: its failure (assertion message included) and the suite's reproduce line."""


def run_suite(pytester: pytest.Pytester, impl: str, marker: str, *extra: str) -> SuiteRun:
    """Run the laws selected by `-m marker` against `impl` (`module:ATTR`, importable from this directory)."""
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    pytester.syspathinsert(HERE)
    recorder = pytester.inline_run(
        "--pyargs", "rl.conformance.test_suite", "--rl-impl", impl, "-m", marker, "-p", "no:cacheprovider", *extra
    )
    passed, skipped, failed = recorder.listoutcomes()
    errors = [r for r in recorder.getreports("pytest_runtest_logreport") if r.failed and r.when != "call"]

    def law(report: pytest.TestReport) -> str:
        return report.nodeid.split("::")[-1]

    return SuiteRun(
        failed=frozenset(law(r) for r in [*failed, *errors]),
        passed=frozenset(law(r) for r in passed),
        skipped=frozenset(law(r) for r in skipped),
        errors=frozenset(law(r) for r in errors),
        reports={law(r): "\n".join([r.longreprtext, *(text for _, text in r.sections)]) for r in [*failed, *errors]},
    )
