"""Run the packaged conformance suite against one implementation, in process, and say which laws failed.

The self-test's only way in is the one a fork uses: `pytest --pyargs rl.conformance.test_suite --rl-impl MODULE:ATTR`,
from a directory without our conftest.py (pytester's), so a broken implementation is caught by the suite as shipped.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import Phase, settings

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


NO_SHRINK = tuple(p for p in Phase if p not in (Phase.shrink, Phase.explain))
"""The phases the self-test runs the laws with: it checks which laws fail and what they say, never a shrunk example,
and shrinking the broken implementations' failures took most of the algorithm cases' time (docs/benchmarks.md).
Which laws fail does not depend on shrinking, the laws' messages are templates over
whatever example failed, and `derandomize=True` makes that example the same on every run."""


class SuiteRunBroke(AssertionError):
    """The in-process suite run ended before reporting its laws (an INTERNALERROR, a collection error, a usage
    error): its outcome lists say nothing about the laws, so no case may be judged from them."""


class _SessionProblems:
    """A plugin for the in-process run: keeps the text of an INTERNALERROR, which no test report carries."""

    def __init__(self) -> None:
        self.internal: list[str] = []

    def pytest_internalerror(self, excrepr: object) -> None:
        self.internal.append(str(excrepr))


class _NoShrinking:
    """A plugin for the in-process run: while it runs, each collected hypothesis law skips shrinking; afterwards every
    law has its own settings back (the contract modules may stay imported in this process and serve other tests).

    Hypothesis reads a decorated test's settings from `_hypothesis_internal_use_settings` at every call; that private
    name is the only way to change them from outside. Should it change, nothing is patched and the laws shrink again:
    slower, never a different outcome."""

    def __init__(self) -> None:
        self.patched: list[tuple[Any, settings]] = []

    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        for item in items:
            function = getattr(getattr(item, "obj", None), "__func__", getattr(item, "obj", None))
            own = getattr(function, "_hypothesis_internal_use_settings", None)
            if own is not None:
                self.patched.append((function, own))
                function._hypothesis_internal_use_settings = settings(own, phases=NO_SHRINK)

    def restore(self) -> None:
        for function, own in reversed(self.patched):
            function._hypothesis_internal_use_settings = own
        self.patched.clear()


def run_suite(pytester: pytest.Pytester, impl: str, marker: str, *extra: str) -> SuiteRun:
    """Run the laws selected by `-m marker` against `impl` (`module:ATTR`, importable from this directory), without
    shrinking (see `NO_SHRINK`)."""
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    pytester.syspathinsert(HERE)
    no_shrinking, problems = _NoShrinking(), _SessionProblems()
    try:
        recorder = pytester.inline_run(
            "--pyargs", "rl.conformance.test_suite", "--rl-impl", impl, "-m", marker, "-p", "no:cacheprovider", *extra,
            plugins=[no_shrinking, problems],
        )  # fmt: skip
    finally:
        no_shrinking.restore()
    if recorder.ret not in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED):
        # A usage error returns a stand-in recorder with `ret` only.
        collected = recorder.getreports("pytest_collectreport") if hasattr(recorder, "getreports") else []
        broken = [str(r.longrepr) for r in collected if r.failed]
        raise SuiteRunBroke(
            f"the suite run for {impl} (-m {marker!r}) ended with exit code {recorder.ret!r} before reporting its "
            "laws, so which laws fail is unknown; its output above has the details. "
            + "\n".join([*problems.internal, *broken])[-3000:]
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
