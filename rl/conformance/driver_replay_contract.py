"""Replay compatibility: a driver must issue the actions of a run recorded by the driver it replaces.

Flyte resumes a crashed driver by replaying its recorded actions, matched by identity (task, content digest of the
inputs, call occurrence); a new driver that re-keys an action (seeds rollouts, orders a batch or builds a step another
way) makes an in-flight run silently retrain from there instead of resuming. The law runs the driver under test on the
simulator with the in-memory tiers and compares the actions it issues with a recorded history
(`rl.conformance.recorded_history`). How to bind a record: docs/conformance.md#replay-compatibility-across-releases.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from rl.conformance.capabilities import Capabilities
from rl.conformance.grpo_driver_contract import MODES, pipelined_mode
from rl.conformance.recorded_history import RecordedHistory, issued_actions, reference_history, replay_violations
from rl.conformance.support.contract_base import ContractBase, tier

if TYPE_CHECKING:
    from rl.loop.grpo import GrpoDriver

__all__ = ["DriverReplayContract"]


@tier("replay")
class DriverReplayContract(ContractBase):
    """The law that lets a new driver version take over in-flight runs: it issues the recorded run's actions.

    Provide `driver` (default `rl.loop.grpo.run_grpo`) and, for a fork whose loop legitimately differs from ours,
    `recorded_history`: your previous release's record (see the module docstring for the command).
    """

    @pytest.fixture
    def driver(self) -> GrpoDriver:
        """Return your driver: `async (config, tiers, store) -> GrpoOutcome`, like `rl.loop.grpo.run_grpo`."""
        from rl.loop.grpo import run_grpo

        return run_grpo

    @pytest.fixture
    def recorded_history(self) -> RecordedHistory:
        """Return the `RecordedHistory` your driver must replay; defaults to the one recorded from our `run_grpo`.

        A fork returns `load_history(Path("tests/data/grpo_history.json").read_text(), source=...)`, its own
        previous release's record."""
        return reference_history()

    @pytest.mark.parametrize("mode", MODES)
    def test_replay_driver_issues_the_recorded_runs_actions(
        self, driver: GrpoDriver, recorded_history: RecordedHistory, capabilities: Capabilities, mode: str
    ) -> None:
        """On the recorded run shape, the driver issues exactly the recorded actions (same tasks, same identities), so
        a run recorded by the previous driver resumes under this one instead of re-executing."""
        pipelined_mode(mode, capabilities)
        issued = issued_actions(driver, recorded_history.config, mode)
        problems = replay_violations(recorded_history.actions[mode], issued)
        assert not problems, (
            f"a {mode} run recorded with {recorded_history.recorded_with} would not resume under this driver: "
            f"{problems[0]}. If the change is deliberate, ship a new recorded history with the release (and do not "
            "upgrade the driver of in-flight runs)"
        )
