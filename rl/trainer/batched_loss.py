"""The train step's loss in padded micro-batches: one reference and one policy forward per micro-batch.

This is the trainer's one loss path, in the single-process step and on every DDP rank. On the tiny CPU model a forward
costs about the same whatever the batch, so batching is most of the train step's speed. The objective is each sample's
token-mean loss, mean over samples (`rl.algorithm.loss.grpo_masked_row_losses`); the tests check it against a reference
that runs two forwards per sample (`tests/loss_reference.py`), which agrees up to float rounding (a batch's matmuls add
in another order than one row's). The path is bitwise reproducible, which is what resume and replay need.
"""

from __future__ import annotations

import contextlib
import math
import weakref
from collections.abc import Callable, Iterator, Sequence

import torch
from peft import PeftModel
from peft.tuners.tuners_utils import BaseTunerLayer

from rl.algorithm.loss import grpo_masked_row_losses
from rl.samplers.decoding import batched_teacher_forced_logprobs
from rl.seeding import dropout_seed
from rl.trainer.config import TrainerConfig
from rl.types import TrainBatch

# Right padding is never attended to by a real token (causal attention) and never read (masked), so any id works.
_PAD_ID = 0
# The statistics a step reports, per sample (`rl.algorithm.loss.grpo_masked_row_losses`' names), in `stat_sums`' order.
STAT_KEYS = ("loss", "kl", "clip_frac")


def batched_backward(
    model: PeftModel,
    batch: TrainBatch,
    advantages: Sequence[float],
    config: TrainerConfig,
    *,
    indices: Sequence[int],
    loss_scale: float,
) -> list[float]:
    """Accumulate `loss_scale * sum_i loss_i` over `indices` into the adapter's gradients, `config.micro_batch_size`
    samples per forward; return the unscaled (loss, kl, clip_frac) sums (`stat_sums`)."""
    stats = empty_stats()
    for fn in batched_loss_fns(
        model, batch, advantages, config, indices=indices, loss_scale=loss_scale, stats_out=stats
    ):
        fn().backward()  # accumulate; this micro-batch's graph is freed here
    return stat_sums(stats)


def empty_stats() -> dict[str, list[float]]:
    """The step's statistics before any sample: one list per statistic, which `batched_loss_fns` extends per sample."""
    return {key: [] for key in STAT_KEYS}


def stat_sums(stats: dict[str, list[float]]) -> list[float]:
    """The sums of the per-sample stats `batched_loss_fns` collected, in `STAT_KEYS` order (what
    `rl.trainer.step.step_metrics` reads)."""
    return [math.fsum(stats[key]) for key in STAT_KEYS]


def batched_loss_fns(
    model: PeftModel,
    batch: TrainBatch,
    advantages: Sequence[float],
    config: TrainerConfig,
    *,
    indices: Sequence[int],
    loss_scale: float,
    stats_out: dict[str, list[float]],
) -> list[Callable[[], torch.Tensor]]:
    """One closure per micro-batch of `config.micro_batch_size` samples of `indices`; calling it runs the micro-batch's
    reference and policy forwards and returns `loss_scale * sum_i loss_i` over it (0-d), extending `stats_out`'s
    lists with each sample's unscaled loss, kl and clip_frac. The single-process step and a DDP rank both call these.

    Dropout masks (if `lora_dropout > 0`) are seeded per micro-batch from (config seed, step, its first sample) by
    `rl.seeding.dropout_seed` (at a micro-batch size of 1, each sample's own seed).

    Shape: per micro-batch of B samples, new/old/ref log-probs and the mask are `[B, T_max]`, advantages `[B]`.
    """
    size = config.micro_batch_size
    share = None if config.share_prompts and not config.gradient_checkpointing else False  # None: by model size

    def make(chunk: list[int]) -> Callable[[], torch.Tensor]:
        def loss_fn() -> torch.Tensor:
            prompts = [batch.rollouts[i].prompt_token_ids for i in chunk]
            completions = [batch.rollouts[i].token_ids for i in chunk]
            with torch.no_grad(), adapters_off(model):
                ref_logp, mask = batched_teacher_forced_logprobs(
                    model, prompts, completions, _PAD_ID, batch.sampling, share_prompts=share
                )  # [B, T]
            seed_dropout(model, dropout_seed(config.seed, batch.step, chunk[0]))
            new_logp, _ = batched_teacher_forced_logprobs(
                model, prompts, completions, _PAD_ID, batch.sampling, share_prompts=share
            )  # [B, T]
            width = new_logp.shape[1]
            old_logp = torch.tensor(
                [list(batch.rollouts[i].logprobs) + [0.0] * (width - len(batch.rollouts[i].logprobs)) for i in chunk],
                dtype=torch.float32,
                device=new_logp.device,
            )  # [B, T]
            adv = torch.tensor([advantages[i] for i in chunk], dtype=torch.float32, device=new_logp.device)  # [B]
            rows, stats = grpo_masked_row_losses(
                new_logp.float(),
                old_logp,
                ref_logp.float(),
                adv,
                mask,
                clip_eps=config.clip_eps,
                kl_beta=config.kl_beta,
                clip_eps_high=config.clip_eps_high,
            )
            for key, values in stats_out.items():
                values.extend(stats[key].tolist())
            return rows.sum() * loss_scale

        return loss_fn

    return [make(list(indices[start : start + size])) for start in range(0, len(indices), size)]


def seed_dropout(model: torch.nn.Module, seed: int) -> None:
    """Seed the generator the model's dropout draws from: on the CPU the default generator alone (what
    `torch.manual_seed` seeds for CPU ops, without its ~0.1 ms of visiting every other backend), elsewhere all."""
    if next(model.parameters()).device.type == "cpu":
        torch.default_generator.manual_seed(seed)
    else:
        torch.manual_seed(seed)


_TUNER_LAYERS: weakref.WeakKeyDictionary[PeftModel, list[BaseTunerLayer]] = weakref.WeakKeyDictionary()


@contextlib.contextmanager
def adapters_off(model: PeftModel) -> Iterator[None]:
    """The base model's forward, as `model.disable_adapter()` gives it (each LoRA layer runs its base layer only), and
    the adapters back on afterwards. PEFT's context re-derives the model's adapter status by walking every module on
    each entry, a few milliseconds per micro-batch on the tiny model; the layers are found once per model here."""
    layers = _TUNER_LAYERS.get(model)
    if layers is None:
        layers = _TUNER_LAYERS[model] = [m for m in model.modules() if isinstance(m, BaseTunerLayer)]
    for layer in layers:
        layer.enable_adapters(False)
    try:
        yield
    finally:
        for layer in layers:
            layer.enable_adapters(True)
