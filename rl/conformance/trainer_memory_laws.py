"""The trainer's memory law, mixed into `TrainerContract`: what a step leaves behind does not grow from step to step.

Why: a trainer that keeps something of every step (a loss with its autograd graph appended to a log, a per-version
cache never evicted, gradients accumulated across steps and never zeroed) runs fine for hundreds of steps and then
runs out of memory, far from the cause (unslothai/unsloth#2470: memory grew every step until it ran out at about
step 600). The law sees the growth in a few steps, where it is cheap.

What it measures: the bytes of tensor storage reachable from live Python objects once a step has returned and the
garbage collector has run (each storage counted once, however many tensors view it). The CPU allocator keeps no
statistics and the process's resident size moves with the allocator's caching, so neither is a measure a law can
hold to a bound; the retained storage is exact and the same on every machine.
"""

from __future__ import annotations

import gc
import itertools
from dataclasses import replace
from typing import Any

import pytest

from rl.conformance.support.contract_base import Run, tier
from rl.protocols import Trainer
from rl.types import TrainBatch

__all__ = ["TrainerMemoryLaws", "retained_tensor_bytes"]

WARMUP_STEPS, MEASURED_STEPS = 2, 3
"""Steps before the first measure (the first steps allocate optimizer moments and caches once), then steps measured."""


def retained_tensor_bytes() -> int:
    """Bytes of the distinct tensor storages reachable from live objects, after a full garbage collection (0 where
    torch was never imported)."""
    import sys

    torch = sys.modules.get("torch")
    if torch is None:
        return 0
    gc.collect()
    seen: dict[int, int] = {}
    for obj in gc.get_objects():
        try:
            if isinstance(obj, torch.Tensor) and obj.device.type != "meta":
                storage = obj.untyped_storage()
                seen[storage.data_ptr() or id(storage)] = storage.nbytes()
        except Exception:
            continue
    return sum(seen.values())


@tier("trainer")
class TrainerMemoryLaws:
    """Needs `trainer`, `train_batch` and `rl_run` (`TrainerContract`'s fixtures), and `step_memory_growth_bytes`."""

    @pytest.fixture
    def step_memory_growth_bytes(self) -> int:
        """The tensor bytes a step may leave behind beyond the step before it; 0, ours, by default (override for a
        trainer that keeps a bounded history, e.g. the last few versions, and say why)."""
        return 0

    def test_trainer_memory_retained_does_not_grow_from_step_to_step(
        self, trainer: Trainer, train_batch: TrainBatch, step_memory_growth_bytes: int, rl_run: Run[Any]
    ) -> None:
        """After 2 warm-up steps, each of 3 further steps on the same-sized batch leaves at most
        `step_memory_growth_bytes` (0 by default) more tensor storage alive than the step before it: nothing of every
        step is kept (a loss with its graph, an unevicted per-version cache, gradients never zeroed)."""
        state, batch, retained = None, train_batch, []
        for step in range(WARMUP_STEPS + MEASURED_STEPS):
            if state is not None:
                rollouts = [replace(r, policy_version=step) for r in train_batch.rollouts]  # on-policy at every step
                batch = replace(
                    train_batch,
                    step=step,
                    rollouts=rollouts,
                    adapter=state.adapter,
                    optimizer_state=state.optimizer_state,
                    new_version=step + 1,
                )
            state = rl_run(trainer.train_step(batch))
            if step >= WARMUP_STEPS - 1:
                retained.append(retained_tensor_bytes())
        growth = [after - before for before, after in itertools.pairwise(retained)]
        assert max(growth) <= step_memory_growth_bytes, (
            f"tensor storage alive after steps {WARMUP_STEPS - 1}..{WARMUP_STEPS + MEASURED_STEPS - 1} (bytes): "
            f"{retained}, "
            f"growing by {growth} a step, over the {step_memory_growth_bytes} declared: the trainer keeps something "
            "of every step (a loss with its autograd graph, a cache per version never evicted, gradients never "
            "zeroed), and a long run runs out of memory. Keep only what the next step reads"
        )
