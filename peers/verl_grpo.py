"""verl's GRPO (`verl==0.9.1`) bound for the conformance suite: `--rl-impl peers.verl_grpo:IMPL`.

verl exposes both as plain functions, called here unchanged:

- advantages: `verl.trainer.ppo.core_algos.compute_grpo_outcome_advantage(token_level_rewards, response_mask, index)`,
  what `RayPPOTrainer` calls for `algorithm.adv_estimator=grpo`, with the group ids as the `index` (verl groups by any
  hashable uid, in any order, so no reordering is needed) and the rewards as float32 one-token `token_level_rewards`
  (verl's reward managers build them with `torch.zeros_like(responses, dtype=torch.float32)`).
- loss: `verl.workers.utils.losses.ppo_loss(config, model_output, data)`, the actor loss of verl's engine workers
  (policy loss from `get_policy_loss_fn("vanilla")` plus `kl_loss_coef` times the aggregated KL), with an
  `ActorConfig` carrying `clip_eps` and `kl_beta`. verl hands it the model's log-probs unpadded (every token of every
  prompt + response, one flat tensor); the adapter lays the given `new_logp` out that way behind a one-token prompt,
  and verl's `no_padding_2_padding` slices it back.

verl's design choices under its `ActorConfig` defaults, read from `verl/trainer/ppo/core_algos.py` and declared as
`ALGORITHM`:

    advantages   A = (r - mean(r_g)) / (std(r_g) + 1e-6), `norm_adv_by_std_in_grpo=True`
                 std: sample (`torch.std`, n - 1); eps 1e-6 added to the std
                 dtype: float32 rewards
                 all-equal group: no guard, so the float32 rounding residue of the mean is divided by ~1e-6
                 one-sample group: mean 0 and std 1, so A = r / (1 + 1e-6): the raw reward, not 0
    loss         `loss_agg_mode="token-mean"`: token losses summed over the batch and divided by the batch's token
                 count (`token_mean`; bound as `batch_loss`)
                 clip: two-sided PPO clip (clip_ratio 0.2) plus dual clip for A < 0 (`clip_ratio_c=3.0`, which
                 must be > 1: always on; declared `dual_clip=3.0`); the log ratio is clamped to [-20, 20]
                 KL: `use_kl_loss=False` by default: declared "none". Its GRPO examples turn on `low_var_kl` = k3
                 with d = ref - new clamped to [-20, 20] and k3 clamped to [-10, 10], added as `kl_loss_coef`
                 (0.001) times its token mean (`ALGORITHM_KL`: "k3" with `kl_clamp=10.0`; the adapter turns it on
                 for kl_beta > 0)
                 off-policy: yes (old_log_probs)
                 dtype: its log-probs' (float32 advantages and old_log_probs); declared float32
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import torch
import verl
from torch import Tensor
from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage
from verl.utils import tensordict_utils as tu
from verl.workers.config import ActorConfig
from verl.workers.utils.losses import ppo_loss

from peers._adapt import check_pair
from rl.conformance import AlgorithmSpec, Implementation

__all__ = ["ALGORITHM", "ALGORITHM_KL", "IMPL", "IMPL_KL", "advantages", "batch_loss"]

VERSION = verl.__version__


def advantages(group_ids: Sequence[int], rewards: Sequence[float]) -> list[float]:
    """verl's GRPO outcome advantages of `rewards`, one per sample in input order."""
    check_pair(group_ids, rewards)
    token_level_rewards = torch.tensor(list(rewards), dtype=torch.float32)[:, None]  # [N, 1]: one response token
    response_mask = torch.ones_like(token_level_rewards)
    adv, _returns = compute_grpo_outcome_advantage(token_level_rewards, response_mask, np.array(list(group_ids)))
    return adv[:, 0].tolist()


def _config(clip_eps: float, kl_beta: float) -> ActorConfig:
    return ActorConfig(
        strategy="fsdp",
        rollout_n=1,
        ppo_micro_batch_size_per_gpu=1,
        clip_ratio=clip_eps,
        clip_ratio_low=clip_eps,
        clip_ratio_high=clip_eps,
        use_kl_loss=kl_beta != 0.0,  # off, verl's default, unless a KL coefficient is asked for
        kl_loss_coef=kl_beta,
        kl_loss_type="low_var_kl",  # what its GRPO examples use with use_kl_loss=True
    )


def batch_loss(
    new_logp: Tensor,
    old_logp: Tensor,
    ref_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_eps: float = 0.2,
    kl_beta: float = 0.03,
) -> tuple[Tensor, dict[str, Any]]:
    """verl's actor `ppo_loss` on given log-probs, on one data-parallel rank.

    Shape: `new_logp`, `old_logp`, `ref_logp`, `mask`: `[B, T]`, each mask row ones then zeros (right padding);
    `advantages`: `[B]` -> loss `[]`.
    """
    batch, length = new_logp.shape
    lengths = [int(n) for n in mask.sum(-1)]
    for row, n in zip(mask, lengths, strict=True):
        if not bool((row[:n] == 1).all() and (row[n:] == 0).all()):
            raise ValueError(f"mask rows must be ones then zeros (right padding), got {row.tolist()}")
    # verl's unpadded model output: per sequence, the log-prob of each token after the first, i.e. prompt (1 token)
    # + response; the response's log-probs sit at [0, n) and the last position predicts past the end (unused).
    flat = torch.cat([torch.cat([new_logp[i, :n], new_logp.new_zeros(1)]) for i, n in enumerate(lengths)])
    data = tu.get_tensordict(
        {
            "prompts": torch.zeros(batch, 1, dtype=torch.long),
            "responses": torch.zeros(batch, length, dtype=torch.long),
            "attention_mask": torch.cat([torch.ones(batch, 1, dtype=torch.long), mask.long()], dim=1),
            "response_mask": mask.long(),
            "old_log_probs": old_logp,
            "advantages": advantages[:, None] * mask.to(advantages.dtype),  # token-level, as verl's estimators give
            "ref_log_prob": ref_logp,
        },
        # What verl's FSDP engine assigns on one rank: the batch's token count, one rank, B sequences.
        {"dp_size": 1, "batch_num_tokens": int(mask.sum()), "global_batch_size": batch},
    )
    loss, _metrics = ppo_loss(_config(clip_eps, kl_beta), {"log_probs": flat}, data)
    return loss, {"loss": float(loss.detach())}


ALGORITHM = AlgorithmSpec(
    advantage_scale="sample_std",  # torch.std: Bessel's n - 1
    std_eps=1e-6,  # compute_grpo_outcome_advantage(epsilon=1e-6), added to the std
    std_eps_placement="std",
    singleton_groups="reward",  # a group of one: mean 0, std 1, so A = r / (1 + 1e-6)
    advantage_dtype="float32",  # float32 token_level_rewards
    loss_aggregation="token_mean",  # loss_agg_mode="token-mean": masked sum / batch_num_tokens
    kl_estimator="none",  # use_kl_loss=False by default (ALGORITHM_KL: on)
    importance_ratio="clipped",  # clip_ratio 0.2
    dual_clip=3.0,  # clip_ratio_c: for A < 0 the loss is at most 3 |A| (always on; it must be > 1)
    loss_dtype="float32",  # the dtype of its advantages and stored old_log_probs
)
"""verl 0.9.1's GRPO choices under its ActorConfig defaults, each read from its source (module docstring)."""

ALGORITHM_KL = replace(ALGORITHM, kl_estimator="k3", kl_clamp=10.0)
"""The same with `use_kl_loss=True`, `kl_loss_type="low_var_kl"` (its GRPO examples): k3 clamped at 10."""

IMPL = Implementation(name=f"verl-{VERSION}", advantages=advantages, batch_loss=batch_loss, algorithm=ALGORITHM)
IMPL_KL = Implementation(
    name=f"verl-{VERSION}-kl", advantages=advantages, batch_loss=batch_loss, algorithm=ALGORITHM_KL
)
