"""The algorithm contracts bound to the implementation `--rl-impl` names, for the packaged suite
(`rl.conformance.test_suite` imports these classes): `advantages` and `sample_loss` come from the `Implementation`, and
a missing one skips its laws, saying which factory is missing."""

from __future__ import annotations

from typing import Any

import pytest

from rl.conformance.algorithm import AdvantageContract, AdvantageFn, LossContract, SampleLossFn
from rl.conformance.implementation import Implementation

__all__ = ["TestAdvantages", "TestLoss"]


def _provided(implementation: Implementation, name: str, laws: str) -> Any:
    function = getattr(implementation, name)
    if function is None:
        pytest.skip(f"{implementation.name} provides no `{name}` factory, so the {laws} laws do not apply")
    return function


class TestAdvantages(AdvantageContract):
    @pytest.fixture
    def advantages(self, implementation: Implementation) -> AdvantageFn:
        return _provided(implementation, "advantages", "advantage")


class TestLoss(LossContract):
    @pytest.fixture
    def sample_loss(self, implementation: Implementation) -> SampleLossFn:
        return _provided(implementation, "sample_loss", "GRPO loss")
