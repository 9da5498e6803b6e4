"""`DdpShardStepContract` bound to the implementation `--rl-impl` names; `rl.conformance.test_suite` imports it.

It reads the session fixture `implementation` that `rl.conformance.test_suite` defines, so it is collected there only.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from rl.conformance.capabilities import Capabilities
from rl.conformance.ddp_shard_step_contract import DdpShardStepContract
from rl.conformance.implementation import Implementation

__all__ = ["TestDdpShardStep"]


class TestDdpShardStep(DdpShardStepContract):
    @pytest.fixture
    def capabilities(self, implementation: Implementation) -> Capabilities:
        return implementation.capabilities

    @pytest.fixture
    def ddp_shard_step(self, implementation: Implementation) -> Callable[..., None]:
        step = implementation.ddp_shard_step
        if step is None:
            pytest.skip(
                f"{implementation.name} provides no `ddp_shard_step` factory, so the DDP shard-step laws do not apply"
            )
        return step
