"""The in-place rewrite law catches a store that trusts a file's unchanged stat with no racy window, and only that law
fails it; a copying store and ours pass it. Run as a fork runs the suite (`--pyargs rl.conformance.test_suite`)."""

from __future__ import annotations

import re

import pytest
from suite_runner import run_suite

pytestmark = pytest.mark.slow  # the volume state machine runs in process for each case (as test_broken_storage.py)

pytest_plugins = ("pytester",)

REWRITE = "test_volumes_a_file_rewritten_in_place_is_published_with_its_new_content"


def test_the_rewrite_law_fails_a_store_that_trusts_a_stat_inside_the_racy_window(pytester):
    run = run_suite(pytester, "broken_rewrites:STAT_TRUSTING", "rl_volumes")
    assert run.failed == {REWRITE}, sorted(run.failed)
    assert re.search(r"the store kept the parent's digest for a file whose bytes changed", run.reports[REWRITE])


@pytest.mark.parametrize("impl", ["broken_volumes:DIR_STORE", "rl.conformance.bindings.ours:IN_MEMORY"])
def test_correct_stores_pass_the_rewrite_law(pytester, impl):
    run = run_suite(pytester, impl, "rl_volumes")
    assert REWRITE in run.passed and not run.failed, run.reports
