"""The algorithm contracts bound to the implementation `--rl-impl` names, for the packaged suite
(`rl.conformance.test_suite` imports these classes): `advantages` and `batch_loss` or `sample_loss` come from the
`Implementation`, the declared choices from its `algorithm`, and a missing function skips its laws, saying which
factory is missing."""

from __future__ import annotations

import pytest

from rl.conformance.advantage_contract import AdvantageContract, AdvantageFn
from rl.conformance.algorithm_spec import AlgorithmSpec
from rl.conformance.implementation import Implementation
from rl.conformance.loss_contract import LossContract, LossUnderTest, sample_loss_as_batch_loss

__all__ = ["TestAdvantages", "TestLoss"]


class TestAdvantages(AdvantageContract):
    @pytest.fixture
    def advantages(self, implementation: Implementation) -> AdvantageFn:
        if implementation.advantages is None:
            pytest.skip(f"{implementation.name} provides no `advantages` factory, so the advantage laws do not apply")
        return implementation.advantages

    @pytest.fixture
    def algorithm(self, implementation: Implementation) -> AlgorithmSpec:
        return implementation.algorithm


class TestLoss(LossContract):
    @pytest.fixture
    def loss_under_test(self, implementation: Implementation) -> LossUnderTest:
        if implementation.batch_loss is not None:
            return LossUnderTest(implementation.batch_loss)
        if implementation.sample_loss is not None:
            return LossUnderTest(sample_loss_as_batch_loss(implementation.sample_loss), implementation.sample_loss)
        pytest.skip(
            f"{implementation.name} provides no `batch_loss` or `sample_loss` factory, so the GRPO loss laws do not "
            "apply"
        )

    @pytest.fixture
    def algorithm(self, implementation: Implementation) -> AlgorithmSpec:
        return implementation.algorithm
