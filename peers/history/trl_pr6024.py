"""TRL PR #6024 (https://github.com/huggingface/trl/pull/6024), bound for the generation-batch normaliser law.

The bug (trl <= 1.9.0): with `loss_type="dapo"` (TRL's default), `_compute_loss` divides each micro-batch's
token-loss sum by `inputs["num_items_in_batch"]`, which `_generate_and_score_completions` computes over the whole
generation batch (`steps_per_generation` micro-batches), while the optimizer steps every `gradient_accumulation_steps`
micro-batches: each optimizer step is scaled by `gradient_accumulation_steps / steps_per_generation`. The fix (trl
1.9.1) multiplies the normaliser by that ratio in `_compute_loss`: every step of a generation batch then divides by the
generation batch's mean tokens per step (`AlgorithmSpec(step_normaliser="generation_mean")`, declared here), not by
its own tokens.

`accumulated_loss` runs TRL's own `_compute_loss` (whichever trl is installed) on each micro-batch of one generation
batch, with the trainer's `args.steps_per_generation` and `current_gradient_accumulation_steps` set as a run with that
split has them, and `num_items_in_batch` what TRL's generation step hands every micro-batch of that generation batch:
the completion tokens of all of it (`accelerator.gather(loss_mask.sum()).sum()`, one process). The model forward is
replaced as in `peers.trl_trainer.compute_loss`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch
from torch import Tensor

from peers.trl_grpo import ALGORITHM
from peers.trl_trainer import VERSION, tiny_trainer
from rl.conformance import Implementation

__all__ = ["IMPL", "accumulated_loss"]


def accumulated_loss(
    micro_batches: Sequence[tuple[Tensor, Tensor, Tensor, Tensor, Tensor]],
    *,
    gradient_accumulation_steps: int,
    clip_eps: float,
    kl_beta: float,
) -> list[Tensor]:
    """TRL's `_compute_loss` on each micro-batch of one generation batch. Shape: each micro-batch's log-probs and mask
    `[B, T]`, advantages `[B]` -> one 0-d loss per micro-batch."""
    trainer = tiny_trainer()
    saved = (trainer.args.steps_per_generation, trainer.current_gradient_accumulation_steps, trainer.beta)
    trainer.epsilon_low = trainer.epsilon_high = clip_eps
    trainer.beta = kl_beta
    trainer.args.steps_per_generation = len(micro_batches)
    trainer.current_gradient_accumulation_steps = gradient_accumulation_steps
    generation_tokens = sum(m[4].sum() for m in micro_batches)  # [] over the whole generation batch
    losses = []
    try:
        for new_logp, old_logp, ref_logp, advantages, mask in micro_batches:
            trainer._get_per_token_logps_and_entropies = lambda *a, _n=new_logp, **k: (
                _n,
                torch.zeros_like(_n).detach(),
                None,
            )
            batch, length = new_logp.shape
            inputs = {
                "prompt_ids": torch.full((batch, 1), 2, dtype=torch.long),
                "prompt_mask": torch.ones(batch, 1, dtype=torch.long),
                "completion_ids": torch.full((batch, length), 4, dtype=torch.long),
                "completion_mask": mask.long(),
                "advantages": advantages,
                "old_per_token_logps": old_logp,
                "ref_per_token_logps": ref_logp,
                "num_items_in_batch": generation_tokens,
            }
            losses.append(trainer._compute_loss(trainer.model, inputs))
    finally:
        trainer.args.steps_per_generation, trainer.current_gradient_accumulation_steps, trainer.beta = saved
    return losses


IMPL = Implementation(
    name=f"trl-{VERSION}-generation-batch",
    accumulated_loss=accumulated_loss,
    # TRL's fix normalises every step of a generation batch by its tokens times G / S: a declared choice.
    algorithm=replace(ALGORITHM, step_normaliser="generation_mean"),
)
