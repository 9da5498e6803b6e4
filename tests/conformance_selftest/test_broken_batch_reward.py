"""The batch-reward scorer laws catch the bugs real scorers had: each broken scorer fails the law it breaks, with a
message naming the bug, and only that law; ours (`rl.scoring.BatchRewardScorer`, in IN_MEMORY) passes.

Every case runs the packaged suite the way a fork does (`--pyargs rl.conformance.test_suite --rl-impl ...`).
"""

from __future__ import annotations

import re

import pytest
from suite_runner import run_suite

# slow: each case runs the packaged suite in process (2-4 s each); `nox -s slow` runs them, `nox -s conformance` runs
# the laws on ours.
pytestmark = pytest.mark.slow

pytest_plugins = ("pytester",)

REFUSES = "test_batch_reward_scorer_refuses_a_reward_count_other_than_one_per_completion"


@pytest.mark.parametrize(
    ("impl", "failing", "message"),
    [
        (
            "broken_batch_reward:BROADCASTING",
            {f"{REFUSES}[one]", f"{REFUSES}[one_too_few]", f"{REFUSES}[one_too_many]"},
            r"returning 1 rewards for 8 completions was scored as \[5\.0, 5\.0, 5\.0.*refuse any other count",
        ),
        (
            "broken_batch_reward:ZIPPED",
            {f"{REFUSES}[one]", f"{REFUSES}[one_too_few]", f"{REFUSES}[one_too_many]"},
            r"returning 7 rewards for 8 completions was scored as \[5\.0, 1\.0, 5\.0",
        ),
    ],
    ids=["single value broadcast (trl#6533)", "zipped to the shorter"],
)
def test_the_batch_reward_laws_fail_a_broken_scorer_on_the_law_it_breaks(pytester, impl, failing, message):
    run = run_suite(pytester, impl, "rl_batch_reward")
    assert run.failed == failing, f"{impl}: failing laws {sorted(run.failed)}; expected {sorted(failing)}"
    reports = "\n".join(run.reports.values())
    assert re.search(message, reports, re.DOTALL), f"no report says {message!r}:\n{reports[-3000:]}"


def test_ours_passes_the_batch_reward_laws(pytester):
    run = run_suite(pytester, "rl.conformance.bindings.ours:IN_MEMORY", "rl_batch_reward")
    assert not run.failed and not run.skipped, run.reports
    assert len(run.passed) == 4, sorted(run.passed)
