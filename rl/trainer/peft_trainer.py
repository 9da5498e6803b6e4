"""The PEFT LoRA trainer: the Trainer protocol over one process's step (`rl.trainer.step`), with its warm state.

Adapters and optimizer states are artifacts (`rl.trainer.adapter`, `rl.trainer.optimizer_state`); between steps the
trainer keeps the model and optimizer it last wrote in memory, so a loop's next step need not load them again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from rl.models.opened_model import ModelDir, checked_model
from rl.protocols import Artifacts
from rl.trainer.adapter import adapter_files, new_adapter, trainable_parameters
from rl.trainer.config import TrainerConfig
from rl.trainer.optimizer_state import build_optimizer, optimizer_files
from rl.trainer.step import PreparedStep, pinned_threads, prepare_step, prepare_warm_step, run_step
from rl.types import StepMetrics, TrainBatch, TrainResult

__all__ = ["PeftTrainer"]


@dataclass
class _Warm:
    """The model and optimizer a step left in memory, and the digests of the artifacts it wrote from them."""

    adapter_digest: str
    optimizer_digest: str
    prepared: PreparedStep


class PeftTrainer:
    """The Trainer protocol on torch + PEFT, one process: LoRA adapters and AdamW state live in `artifacts`.

    Compute runs on the calling thread (an async method that blocks): in production each step is its own task, and in
    one process a worker thread would let a concurrent sampler change torch's global thread count mid-step.

    `device` is where a step's forward and backward run ("cpu", or "cuda"/"cuda:N" on a GPU). Version 0 is always
    initialised on the CPU, so its bytes are the same on every machine; artifacts never name a device.

    Warm: after a step the trainer keeps its model and optimizer in memory beside the digests of the artifacts it wrote.
    A batch naming exactly those digests continues from memory; anything else (another adapter, a restarted process, a
    step that raised) loads the base, adapter and optimizer from the artifacts. Both paths give the same bytes
    (`tests/test_peft_trainer.py` checks it); `cold_loads` counts the loads.
    """

    def __init__(
        self,
        base_dir: ModelDir,
        artifacts: Artifacts,
        config: TrainerConfig | None = None,
        *,
        device: str | torch.device = "cpu",
    ) -> None:
        self.base_dir = checked_model(base_dir, weights=True)  # the base opened at the command's door
        self.artifacts = artifacts
        self.config = config if config is not None else TrainerConfig()
        self.device = torch.device(device)
        self._warm: _Warm | None = None
        self.cold_loads = 0

    async def init_adapter(self, seed: int) -> TrainResult:
        """Version 0: a fresh LoRA adapter (a function of `seed`) and the optimizer state of a fresh AdamW."""
        with pinned_threads(self.config.threads):
            model = new_adapter(self.base_dir, self.config, seed)
            params = trainable_parameters(model)
            optimizer = build_optimizer(params, self.config, None)
            adapter = adapter_files(model)
            opt_state = optimizer_files(optimizer, [name for name, _ in params])
        adapter_ref = await self.artifacts.put(adapter, name="adapter-v0")
        opt_ref = await self.artifacts.put(opt_state, name="optimizer-v0")
        metrics = StepMetrics(loss=0.0, contributing=0, skipped_zero_advantage=0)
        return TrainResult(adapter=adapter_ref, optimizer_state=opt_ref, policy_version=0, metrics=metrics)

    async def train_step(self, batch: TrainBatch) -> TrainResult:
        """One GRPO step on `batch`: returns adapter version `batch.new_version`, its optimizer state and metrics."""
        warm, self._warm = self._warm, None  # a step that raises must not leave a half-updated model behind
        opt_digest = batch.optimizer_state.digest if batch.optimizer_state is not None else None
        if warm is not None and (warm.adapter_digest, warm.optimizer_digest) == (batch.adapter.digest, opt_digest):
            with pinned_threads(self.config.threads), torch.random.fork_rng(devices=[]):
                prepared = prepare_warm_step(batch, self.config, warm.prepared)
                new_adapter_files, new_opt_files, metrics = run_step(batch, prepared, self.config)
        else:
            adapter = await self.artifacts.get(batch.adapter)
            opt_state = await self.artifacts.get(batch.optimizer_state) if batch.optimizer_state is not None else None
            prepared, (new_adapter_files, new_opt_files, metrics) = self._cold_step(batch, adapter, opt_state)
        adapter_ref = await self.artifacts.put(new_adapter_files, name=f"adapter-v{batch.new_version}")
        opt_ref = await self.artifacts.put(new_opt_files, name=f"optimizer-v{batch.new_version}")
        self._warm = _Warm(adapter_ref.digest, opt_ref.digest, prepared)
        return TrainResult(
            adapter=adapter_ref, optimizer_state=opt_ref, policy_version=batch.new_version, metrics=metrics
        )

    def compute_step(
        self, batch: TrainBatch, adapter: Mapping[str, bytes], optimizer_state: Mapping[str, bytes] | None
    ) -> tuple[dict[str, bytes], dict[str, bytes], StepMetrics]:
        """The step on in-memory artifact files: (adapter files, optimizer files, metrics). Pure in its inputs."""
        return self._cold_step(batch, adapter, optimizer_state)[1]

    def _cold_step(
        self, batch: TrainBatch, adapter: Mapping[str, bytes], optimizer_state: Mapping[str, bytes] | None
    ) -> tuple[PreparedStep, tuple[dict[str, bytes], dict[str, bytes], StepMetrics]]:
        self.cold_loads += 1
        with pinned_threads(self.config.threads), torch.random.fork_rng(devices=[]):
            prepared = prepare_step(self.base_dir, batch, self.config, adapter, optimizer_state, device=self.device)
            return prepared, run_step(batch, prepared, self.config)
