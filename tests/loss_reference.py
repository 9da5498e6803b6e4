"""The per-sample reference of the train step's loss, which the trainer's batched path (`rl.trainer.batched_loss`) is
checked against: two unbatched forwards per sample (reference with the adapter off, then policy), each sample's
`rl.algorithm.loss.grpo_sample_loss`, its numbers independent of its neighbours. The two agree up to float rounding (a
batch's matmuls add in another order than one row's); each is bitwise reproducible on its own.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import torch
from peft import PeftModel

from rl.algorithm.loss import grpo_sample_loss
from rl.models.opened_model import open_model
from rl.samplers.decoding import teacher_forced_logprobs
from rl.seeding import dropout_seed
from rl.trainer.adapter import adapter_files
from rl.trainer.batched_loss import empty_stats, seed_dropout, stat_sums
from rl.trainer.config import TrainerConfig
from rl.trainer.step import clip_and_step, pinned_threads, prepare_step, step_metrics
from rl.types import StepMetrics, TrainBatch


def sample_loss_fns(
    model: PeftModel,
    batch: TrainBatch,
    advantages: Sequence[float],
    config: TrainerConfig,
    *,
    indices: Sequence[int],
    loss_scale: float,
    stats_out: dict[str, list[float]],
) -> list[Callable[[], torch.Tensor]]:
    """One closure per sample in `indices`; calling it runs that sample's forward and returns `loss_i * loss_scale`.

    The reference log-probs (the base with the adapter disabled) are computed here for all of `indices`, in one
    adapter-disabled block of unbatched forwards; each closure computes the new log-probs with the adapter (with grad),
    takes the rollout's sampling log-probs as old, and returns the per-sample GRPO loss (token mean). Each call extends
    `stats_out`'s lists (the trainer's statistics shape, `rl.trainer.batched_loss.empty_stats`) with that sample's
    unscaled stats. Dropout masks are seeded by `rl.seeding.dropout_seed` (config seed, step, sample index), as the
    batched path seeds a micro-batch of one.

    Shape: each closure returns a 0-d tensor; internally new/old/ref log-probs are [T_i] over sample i's completion.
    """
    with torch.no_grad(), model.disable_adapter():
        ref_logps = {
            i: teacher_forced_logprobs(
                model, batch.rollouts[i].prompt_token_ids, batch.rollouts[i].token_ids, batch.sampling
            )  # [T_i]
            for i in indices
        }

    def make(i: int) -> Callable[[], torch.Tensor]:
        rollout = batch.rollouts[i]

        def loss_fn() -> torch.Tensor:
            seed_dropout(model, dropout_seed(config.seed, batch.step, i))
            new_logp = teacher_forced_logprobs(
                model, rollout.prompt_token_ids, rollout.token_ids, batch.sampling
            )  # [T]
            old_logp = torch.tensor(rollout.logprobs, dtype=torch.float32, device=new_logp.device)  # [T]
            loss, stats = grpo_sample_loss(
                new_logp.float(),
                old_logp,
                ref_logps[i].float(),
                advantages[i],
                clip_eps=config.clip_eps,
                kl_beta=config.kl_beta,
                clip_eps_high=config.clip_eps_high,
            )
            for key, values in stats_out.items():
                values.append(stats[key])
            return loss * loss_scale

        return loss_fn

    return [make(i) for i in indices]


def reference_step(
    base_dir: Path,
    batch: TrainBatch,
    config: TrainerConfig,
    adapter: Mapping[str, bytes],
    optimizer_state: Mapping[str, bytes] | None,
) -> tuple[dict[str, bytes], StepMetrics]:
    """`rl.trainer.step.run_step` on the CPU with the per-sample loss in place of the batched one: the adapter files
    and metrics of one step, each sample's graph freed after its backward."""
    with pinned_threads(config.threads), torch.random.fork_rng(devices=[]):
        prepared = prepare_step(open_model(base_dir, tokenizer=False), batch, config, adapter, optimizer_state)
        stats = empty_stats()
        grad_norm = 0.0
        if prepared.contributing:
            scale = 1.0 / len(prepared.contributing)
            for fn in sample_loss_fns(
                prepared.model,
                batch,
                prepared.advantages,
                config,
                indices=prepared.contributing,
                loss_scale=scale,
                stats_out=stats,
            ):
                fn().backward()
            grad_norm = clip_and_step(prepared, config)
        return adapter_files(prepared.model), step_metrics(stat_sums(stats), prepared, grad_norm)
