"""The algorithm's contracts, under their first module's name: `AdvantageContract` (`rl.conformance.advantage_laws`)
and `LossContract` (`rl.conformance.loss_laws`), with the function types they check. Import them from
`rl.conformance`; this module keeps `from rl.conformance.algorithm import ...` working."""

from __future__ import annotations

from rl.conformance.advantage_laws import AdvantageContract, AdvantageFn
from rl.conformance.loss_laws import BatchLossFn, LossContract, SampleLossFn, sample_loss_as_batch_loss

__all__ = [
    "AdvantageContract",
    "AdvantageFn",
    "BatchLossFn",
    "LossContract",
    "SampleLossFn",
    "sample_loss_as_batch_loss",
]
