"""The engine-update laws catch engines that keep one version's state into the next: each broken engine fails the
update law it breaks, with a message naming the bug, and no other engine law; ours (IN_MEMORY) passes both.

Every case runs the packaged suite the way a fork does (`--pyargs rl.conformance.test_suite --rl-impl ...`).
"""

from __future__ import annotations

import re

import pytest
from suite_runner import run_suite

# slow: each case runs the engine laws in process; `nox -s slow` runs them, `nox -s conformance` the laws on ours.
pytestmark = pytest.mark.slow

pytest_plugins = ("pytester",)

SERVED = "test_engine_serves_a_new_version_of_a_prompt_it_served_as_a_fresh_engine_does"
PAUSED = "test_engine_paused_and_resumed_serves_a_version_published_meanwhile"


@pytest.mark.parametrize(
    ("impl", "failing", "message"),
    [
        (
            "broken_engine_updates:PREFIX_CACHE",
            {SERVED, PAUSED},
            r"state from the older version \(a prefix or KV cache keyed without the adapter",
        ),
        (
            "broken_engine_updates:RESIDENT_AFTER_CLOSE",
            {PAUSED},
            r"then close, the engine served adapter .* a fresh engine gives: what it held before the pause",
        ),
        (
            "broken_engine_updates:RESIDENT_AFTER_WAKE",
            {PAUSED},
            r"then sleep and wake_up, the engine served adapter .* a fresh engine gives",
        ),
    ],
    ids=["prefix cache keyed by the prompt", "weights resident through close", "weights resident through sleep"],
)
def test_the_update_laws_fail_an_engine_that_keeps_an_older_versions_state(pytester, impl, failing, message):
    run = run_suite(pytester, impl, "rl_engine")
    unexpected = "".join(f"\n--- {name}\n{text[-1500:]}" for name, text in run.reports.items() if name not in failing)
    assert run.failed == failing, f"{impl}: failing laws {sorted(run.failed)}; expected {sorted(failing)}{unexpected}"
    reports = "\n".join(run.reports.values())
    assert re.search(message, reports, re.DOTALL), f"no report says {message!r}:\n{reports[-3000:]}"


def test_ours_passes_the_update_laws(pytester):
    run = run_suite(pytester, "rl.conformance.bindings.ours:IN_MEMORY", "rl_engine", "-k", f"{SERVED} or {PAUSED}")
    assert not run.failed, run.reports
    assert run.passed == {SERVED, PAUSED} and not run.skipped, run
