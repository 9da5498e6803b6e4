"""The self-test's runner refuses to judge a suite run that ended before reporting its laws."""

from __future__ import annotations

import pytest
from suite_runner import SuiteRunBroke, run_suite

pytest_plugins = ("pytester",)


def test_a_run_that_never_reports_its_laws_is_an_error_not_an_empty_list_of_failing_laws(pytester):
    """An INTERNALERROR (CPython 3.11.7's re-entered `ast.parse`, say) or a usage error leaves the outcome lists empty:
    read as "no law failed", it made a broken implementation look caught by nothing."""
    with pytest.raises(SuiteRunBroke, match=r"exit code .*USAGE_ERROR"):
        run_suite(pytester, "rl.conformance.bindings.ours:IN_MEMORY", "rl_engine", "--no-such-option")
