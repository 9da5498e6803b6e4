"""The trainer memory law catches a trainer that keeps something of every step, and only that law fails; ours
(IN_MEMORY) passes it (REAL_CPU's PEFT trainer passes it in `nox -s conformance`).

Every case runs the packaged suite the way a fork does (`--pyargs rl.conformance.test_suite --rl-impl ...`).
"""

from __future__ import annotations

import pytest
import torch  # noqa: F401  (imported before the in-process runs, which must not import it afresh)
from suite_runner import run_suite

# slow: each case runs every trainer law in process; `nox -s slow` runs them.
pytestmark = pytest.mark.slow

pytest_plugins = ("pytester",)

LAW = "test_trainer_memory_retained_does_not_grow_from_step_to_step"


def test_the_memory_law_fails_a_trainer_that_keeps_every_steps_loss(pytester):
    run = run_suite(pytester, "broken_trainer_memory:LOSS_LOG", "rl_trainer")
    assert run.failed == {LAW}, f"failing laws {sorted(run.failed)}; expected only {LAW}: {run.reports}"
    assert "growing by [4100, 4100, 4100] a step, over the 0 declared" in run.reports[LAW], run.reports[LAW]


def test_ours_passes_the_memory_law(pytester):
    run = run_suite(pytester, "rl.conformance.bindings.ours:IN_MEMORY", "rl_trainer", "-k", LAW)
    assert run.passed == {LAW}, run
