"""The shape glue the peer adapters share (`peers/_adapt.py`); the adapters themselves run in `nox -s peers`."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

from rl.loss import LossSample, grpo_batch_loss, grpo_sample_loss

# peers/ is not installed (it is not in the wheel): load its one library-free module from the checkout.
_SPEC = importlib.util.spec_from_file_location(
    "peers_adapt", Path(__file__).resolve().parents[1] / "peers" / "_adapt.py"
)
assert _SPEC is not None and _SPEC.loader is not None
_adapt = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(_adapt)
groups_by_size, sample_loss_from = _adapt.groups_by_size, _adapt.sample_loss_from


def test_groups_by_size_buckets_interleaved_groups_in_order_of_first_appearance():
    """Every sample lands in exactly one group, groups keep input order within them, buckets are keyed by size."""
    assert groups_by_size([0, 5, 0, 7, -3, -3, -3]) == {2: [[0, 2]], 1: [[1], [3]], 3: [[4, 5, 6]]}
    assert groups_by_size([]) == {}


def test_sample_loss_from_a_batch_loss_is_that_loss_on_a_batch_of_one():
    """Wrapping our batch loss gives our per-sample loss and gradient: the wrapper only reshapes."""

    def batch_loss(new, old, ref, adv, mask, *, clip_eps, kl_beta):
        assert new.shape == mask.shape == (1, 3) and adv.shape == (1,) and adv.dtype == new.dtype
        return grpo_batch_loss([LossSample(new[0], old[0], ref[0], float(adv[0]))], clip_eps, kl_beta)

    old = torch.tensor([-1.0, -2.0, -0.5], dtype=torch.float64)
    ref = torch.tensor([-1.5, -2.0, -0.1], dtype=torch.float64)
    new_a = (old + 0.1).requires_grad_()
    new_b = (old + 0.1).requires_grad_()
    loss_a, stats = sample_loss_from(batch_loss)(new_a, old, ref, 0.7, clip_eps=0.2, kl_beta=0.05)
    loss_b, _ = grpo_sample_loss(new_b, old, ref, 0.7, clip_eps=0.2, kl_beta=0.05)
    loss_a.backward()
    loss_b.backward()
    assert loss_a.item() == loss_b.item() and stats["loss"] == loss_a.item()
    assert torch.equal(new_a.grad, new_b.grad)
