"""The rollout buffer's read law catches a buffer that trusts its storage: a buffer checking rewards on `append` only
fails it for every non-finite reward, one checking reads for NaN only fails it for both infinities, and a buffer
that checks its reads passes, as ours does (IN_MEMORY, `rl.storage.volumes.VolumeBuffer`).

Every case runs the packaged suite the way a fork does (`--pyargs rl.conformance.test_suite --rl-impl ...`).
"""

from __future__ import annotations

import pytest
from suite_runner import run_suite

# slow: each case runs the packaged suite in process (2-4 s each); `nox -s slow` runs them, `nox -s conformance` runs
# the laws on ours.
pytestmark = pytest.mark.slow

pytest_plugins = ("pytester",)

LAW = "test_buffer_read_refuses_a_stored_non_finite_reward"


@pytest.mark.parametrize(
    ("impl", "failing"),
    [
        ("broken_buffer_reads:TRUSTED_READS", {f"{LAW}[inf]", f"{LAW}[-inf]", f"{LAW}[nan]"}),
        ("broken_buffer_reads:NAN_ONLY_READS", {f"{LAW}[inf]", f"{LAW}[-inf]"}),
        ("broken_buffer_reads:CHECKED_READS", set()),
        ("rl.conformance.bindings.ours:IN_MEMORY", set()),
    ],
    ids=["reads trusted", "reads checked for NaN only", "reads checked", "ours (IN_MEMORY)"],
)
def test_the_read_law_fails_a_buffer_that_trusts_what_it_stored(pytester, impl, failing):
    run = run_suite(pytester, impl, "rl_buffer_reads")
    assert run.failed == failing, f"{impl}: failing {sorted(run.failed)}; expected {sorted(failing)}: {run.reports}"
    assert not run.skipped and len(run.passed) + len(run.failed) == 3, (sorted(run.passed), sorted(run.skipped))
    for law in failing:
        assert "would be trained on" in run.reports[law], run.reports[law]
