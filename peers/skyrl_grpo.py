# ruff: noqa: F821, UP045, UP006, UP035, E501  (code copied verbatim: its own annotations and style)
"""SkyRL's GRPO advantages and loss, copied verbatim (skyrl-train 0.3.1 and skyrl 0.4.0 need Python 3.12; this
project's is 3.11) and bound for the conformance suite: `--rl-impl peers.skyrl_grpo:IMPL`.

Provenance: github.com/NovaSky-AI/SkyRL at commit a9564572eb8e91076be43c1bd5e4615e3de17265 (2026-08-21), Apache-2.0.
Copied verbatim, between the marker lines:

- `masked_mean`, `safe_exp_delta`: skyrl/backends/skyrl_train/utils/torch_utils.py, lines 180-192;
- `compute_approx_kl`: skyrl/backends/skyrl_train/utils/ppo_utils.py, lines 88-126; `ppo_policy_loss`: lines 557-587
  (its registry decorators left out); `reduce_loss`, `apply_loss_reduction_to_advantages_minibatch`: lines
  1145-1221; `compute_grpo_outcome_advantage`: lines 1344-1393 (decorator left out);
- `apply_off_policy_correction`: skyrl/backends/skyrl_train/utils/off_policy_correction_utils.py, lines 351-385;
- in `batch_loss`, the KL statements of `PolicyWorker`'s training step: skyrl/backends/skyrl_train/workers/worker.py,
  lines 1070-1080. The glue (the config object, the advantage scaling the trainer applies before the worker, the
  sum the worker backpropagates with one data-parallel rank and one micro-batch) is ours.

SkyRL's choices under its defaults (skyrl/train/config/config.py: `loss_reduction="token_mean"`,
`policy_loss_type="regular"`, eps_clip_low = eps_clip_high = 0.2, `use_kl_loss=True`, `kl_estimator_type="k3"`,
`kl_loss_coef=0.001`), declared as `ALGORITHM`:

    advantages   (r - mean) / (torch.std + 1e-6): the sample std; a group of one: mean 0, std 1 (verl's convention)
    loss         policy: advantages divided by the batch's token count, token losses summed (the batch's token mean)
                 KL: k3 clamped to [-10, 10], `masked_mean(kl, loss_mask, dim=-1).mean()`: each completion's token
                 mean, then the mean over completions, beside the token-mean policy loss
                 the ratio: `safe_exp_delta` exponentiates in float32 whatever the input dtype
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Optional, Tuple

import numpy as np
import torch
from torch import Tensor

from peers._adapt import check_pair
from rl.conformance import AlgorithmSpec, Implementation

__all__ = ["ALGORITHM", "IMPL", "advantages", "batch_loss"]

VERSION = "a956457"
AlgorithmConfig = DictConfig = SimpleNamespace  # the config types the copied signatures name


# fmt: off
# ---- verbatim: skyrl/backends/skyrl_train/utils/torch_utils.py, lines 180-192 ----------------------------------------
def masked_mean(tensor: torch.Tensor, mask: torch.Tensor | None, dim: int | None = None) -> torch.Tensor:
    """Compute the mean of tensor elements, optionally masked and reduced along a dimension."""
    if mask is None:
        return tensor.mean(axis=dim)
    return (tensor * mask).sum(axis=dim) / mask.sum(axis=dim).clamp(min=1.0)


def safe_exp_delta(delta: torch.Tensor, clip: float = 20.0, out_dtype=None) -> torch.Tensor:
    """
    Clamp the delta before exponentiating to avoid potential overflow.
    """
    y = torch.clamp(delta.to(torch.float32), -clip, clip).exp()
    return y.to(out_dtype or delta.dtype)


# ---- verbatim: skyrl/backends/skyrl_train/utils/ppo_utils.py, lines 88-126 -----------------------------------------------
def compute_approx_kl(
    log_probs: torch.Tensor,
    log_probs_base: torch.Tensor,
    loss_mask: Optional[torch.Tensor] = None,
    kl_estimator_type: str = "k3",
) -> torch.Tensor:
    """
    Compute the approximate KL divergence between two distributions.
    Schulman blog: http://joschu.net/blog/kl-approx.html

    Args:
        log_probs: Log probabilities of the new distribution.
        log_probs_base: Log probabilities of the base distribution.
        loss_mask: Optional mask over trainable response tokens.
        kl_estimator_type: One of ``k1``, ``abs``, ``k2``, or ``k3``.
    """
    if kl_estimator_type == "k1":
        kld = log_probs - log_probs_base
    elif kl_estimator_type == "abs":
        kld = (log_probs - log_probs_base).abs()
    elif kl_estimator_type == "k2":
        kld = 0.5 * (log_probs - log_probs_base).square()
    # J. Schulman. Approximating kl divergence, 2020.
    # URL http://joschu.net/blog/kl-approx.html.
    elif kl_estimator_type == "k3":
        kl = log_probs_base - log_probs
        # For numerical stability
        kl = torch.clamp(kl, min=-20, max=20)
        ratio = torch.exp(kl)
        kld = (ratio - kl - 1).contiguous()
        kld = torch.clamp(kld, min=-10, max=10)
    else:
        raise ValueError(f"Invalid KL estimator type: {kl_estimator_type}")

    if loss_mask is not None:
        # Multiplying by `loss_mask` can leak `nan` from masked positions,
        # so route masked positions to 0.0 directly while keeping mask scaling elsewhere
        kld = torch.where(loss_mask.bool(), kld * loss_mask, 0.0)
    return kld


# ---- verbatim: ppo_utils.py, lines 557-587 ---------------------------------------------------------------------------
def ppo_policy_loss(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    config: AlgorithmConfig,
    loss_mask: Optional[torch.Tensor] = None,
    rollout_logprobs: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, dict[str, float]]:
    assert config.policy_loss_type in ["regular", "dual_clip"], "loss_type must be either 'regular' or 'dual_clip'"

    ratio = safe_exp_delta(log_probs - old_log_probs, clip=20.0, out_dtype=log_probs.dtype)
    surr1 = ratio * advantages
    surr2 = ratio.clamp(1 - config.eps_clip_low, 1 + config.eps_clip_high) * advantages
    loss = -torch.min(surr1, surr2)
    clip_ratio = masked_mean((-surr2 > -surr1).float(), loss_mask).mean().detach().item()
    clip_pg_losses1 = loss
    if config.policy_loss_type == "dual_clip":
        pg_losses3 = -advantages * config.clip_ratio_c
        clip_pg_losses2 = torch.min(pg_losses3, clip_pg_losses1)
        loss = torch.where(advantages < 0, clip_pg_losses2, clip_pg_losses1)

    loss_metrics = {"clip_ratio": clip_ratio}

    # apply off policy correction
    loss, loss_mask, off_policy_metrics = apply_off_policy_correction(
        loss, old_log_probs, rollout_logprobs, loss_mask, config.off_policy_correction
    )
    loss_metrics.update(off_policy_metrics)

    loss = reduce_loss(loss, loss_mask)
    return loss, loss_metrics


# ---- verbatim: skyrl/backends/skyrl_train/utils/off_policy_correction_utils.py, lines 351-385 -----------------------
def apply_off_policy_correction(
    loss: torch.Tensor,
    old_log_probs: torch.Tensor,
    rollout_logprobs: Optional[torch.Tensor],
    loss_mask: torch.Tensor,
    off_policy_correction: DictConfig,
) -> Tuple[torch.Tensor, torch.Tensor, dict]:
    """
    Apply off-policy correction to the loss tensor.

    This is a convenience wrapper around compute_off_policy_correction that
    handles the common pattern of applying the TIS ratio and updating metrics.

    Args:
        loss: The policy loss tensor to correct.
        old_log_probs: Log probabilities from the old policy (before update).
        rollout_logprobs: Log probabilities from the rollout policy (None if not available).
        loss_mask: Mask indicating valid tokens per sequence.
        off_policy_correction: Off-policy correction config.

    Returns:
        Tuple of (corrected_loss, updated_loss_mask, metrics):
        - corrected_loss: Loss tensor after applying TIS ratio (if enabled)
        - updated_loss_mask: Loss mask after applying sequence/outlier masks
        - metrics: Dict with off-policy correction statistics
    """
    metrics = {}
    if rollout_logprobs is not None:
        tis_ratio, off_policy_metrics, loss_mask = compute_off_policy_correction(
            old_log_probs, rollout_logprobs, loss_mask, off_policy_correction
        )
        if tis_ratio is not None:
            loss = loss * tis_ratio
        metrics.update(off_policy_metrics)
    return loss, loss_mask, metrics


# ---- verbatim: ppo_utils.py, lines 1145-1221 -------------------------------------------------------------------------
def reduce_loss(
    loss: torch.Tensor,
    loss_mask: Optional[torch.Tensor],
) -> torch.Tensor:
    return (loss * loss_mask).sum() if loss_mask is not None else loss.sum()


def apply_loss_reduction_to_advantages_minibatch(
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    loss_reduction: str,
    micro_batch_size: int,
    max_seq_len: int,
    prompt_boundaries: Optional[List[Tuple[int, int]]] = None,
) -> torch.Tensor:
    """Scale advantages so that summing produces the desired loss reduction.

    Args:
        advantages: Advantage tensor of shape (minibatch_size, seq_len).
            For step-wise training, minibatch_size can be variable.
        loss_mask: Mask of shape (minibatch_size, seq_len) indicating valid loss tokens.
        loss_reduction: One of "token_mean", "token_mean_legacy", "sequence_mean",
            "seq_mean_token_sum_norm", "prompt_mean".
        micro_batch_size: Number of sequences per micro-batch
        max_seq_len: Maximum sequence length.
        prompt_boundaries: Mini-batch-relative (start, end) slices grouping the sequences of
            each prompt. Required for "prompt_mean"; ignored otherwise.

    Returns:
        Scaled advantages tensor.
    """
    batch_size = advantages.shape[0]
    normalized_advantages = torch.zeros_like(advantages)

    # Option 1: token mean
    if loss_reduction == "token_mean":
        normalized_advantages = advantages / loss_mask.sum().clamp(min=1)

    # Option 1b: legacy token-mean that normalizes per-microbatch then averages across microbatches.
    elif loss_reduction == "token_mean_legacy":
        # FIXME(Charlie): For step-wise training, mini_batch_size can be variable, so the number of
        # microbatches depends on how we pad.
        num_micro_batches = batch_size // micro_batch_size
        for i in range(num_micro_batches):
            start_idx = i * micro_batch_size
            end_idx = (i + 1) * micro_batch_size
            mb_advantages = advantages[start_idx:end_idx]
            mb_loss_mask = loss_mask[start_idx:end_idx]
            mb_advantages = mb_advantages / mb_loss_mask.sum().clamp(min=1)
            mb_advantages /= num_micro_batches
            normalized_advantages[start_idx:end_idx] = mb_advantages

    # Option 2: sequence mean
    elif loss_reduction == "sequence_mean":
        normalized_advantages = advantages / (batch_size * loss_mask.sum(dim=-1, keepdim=True).clamp(min=1))

    # Option 3: Dr. GRPO style loss reduction to avoid length bias by normalizing by a constant
    elif loss_reduction == "seq_mean_token_sum_norm":
        normalized_advantages = advantages / (batch_size * max_seq_len)

    # Option 4: Prompt level mean - token mean within each prompt, then average over all prompts.
    # A "prompt" is a group of sequences sharing the same prompt (e.g. the n_samples_per_prompt
    # GRPO responses). Scale token [i, t] in prompt p by 1 / (num_prompts * tokens_in_prompt_p)
    # so that summing the per-token policy loss yields mean_p(token_mean within prompt p).
    elif loss_reduction == "prompt_mean":
        if prompt_boundaries is None:
            raise ValueError("`prompt_mean` loss reduction requires `prompt_boundaries`")
        num_prompts = len(prompt_boundaries)
        for p_start, p_end in prompt_boundaries:
            prompt_tokens = loss_mask[p_start:p_end].sum().clamp(min=1)
            normalized_advantages[p_start:p_end] = advantages[p_start:p_end] / (num_prompts * prompt_tokens)

    else:
        raise ValueError(f"Invalid loss reduction type: {loss_reduction}")

    return normalized_advantages


# ---- verbatim: ppo_utils.py, lines 1344-1393 -------------------------------------------------------------------------
def compute_grpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    grpo_norm_by_std: bool = True,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """
    Compute advantage for GRPO, operating only on Outcome reward (with only one scalar reward for each response).

    Expects:
        - token_level_rewards: Float[torch.Tensor, "batch_size response_len"]
        - response_mask: Float[torch.Tensor, "batch_size response_len"]
        - index: np.ndarray (batch_size)
        - epsilon: float
        - grpo_norm_by_std: bool

    Returns:
        - advantages: Float[torch.Tensor, "batch_size response_len"]
        - returns: Float[torch.Tensor, "batch_size response_len"]
    """
    # this assumes response-level rewards
    scores = token_level_rewards.sum(dim=-1)

    id2score = defaultdict(list)
    id2mean = {}
    id2std = {}

    with torch.no_grad():
        bsz = scores.shape[0]
        for i in range(bsz):
            id2score[index[i]].append(scores[i])
        for idx in id2score:
            if len(id2score[idx]) == 1:
                id2mean[idx] = torch.tensor(0.0)
                id2std[idx] = torch.tensor(1.0)
            elif len(id2score[idx]) > 1:
                id2mean[idx] = torch.mean(torch.tensor(id2score[idx]))
                id2std[idx] = torch.std(torch.tensor([id2score[idx]]))
            else:
                raise ValueError(f"no score in prompt index: {idx}")
        for i in range(bsz):
            if grpo_norm_by_std:
                scores[i] = (scores[i] - id2mean[index[i]]) / (id2std[index[i]] + epsilon)
            else:
                scores[i] = scores[i] - id2mean[index[i]]
        scores = scores.unsqueeze(-1) * response_mask

    return scores, scores
# fmt: on
# ---- end of verbatim copies -----------------------------------------------------------------------------------------


def advantages(group_ids: Sequence[int], rewards: Sequence[float]) -> list[float]:
    """SkyRL's `compute_grpo_outcome_advantage` on float32 one-token rewards, the group ids as its `index`."""
    check_pair(group_ids, rewards)
    scores = torch.tensor([[r] for r in rewards], dtype=torch.float32)  # [B, 1]: the reward on the response's token
    out, _ = compute_grpo_outcome_advantage(scores, torch.ones_like(scores), np.array(list(group_ids)))
    return out[:, 0].tolist()


def batch_loss(
    new_logp: Tensor,
    old_logp: Tensor,
    ref_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_eps: float = 0.2,
    kl_beta: float = 0.001,
) -> Tensor:
    """The loss SkyRL's policy worker backpropagates, one data-parallel rank and one micro-batch: `ppo_policy_loss` on
    the advantages the trainer scaled for `loss_reduction="token_mean"`, plus the KL term.

    Shape: `new_logp`, `old_logp`, `ref_logp`, `mask`: `[B, T]`; `advantages`: `[B]` -> loss `[]`.
    """
    off = SimpleNamespace()
    config = SimpleNamespace(
        policy_loss_type="regular", eps_clip_low=clip_eps, eps_clip_high=clip_eps, off_policy_correction=off
    )
    per_token = advantages.unsqueeze(-1).expand(mask.shape) * mask  # [B, T], as the trainer broadcasts them
    scaled = apply_loss_reduction_to_advantages_minibatch(
        per_token, mask, "token_mean", new_logp.shape[0], mask.shape[1]
    )
    policy_loss, _ = ppo_policy_loss(new_logp, old_logp, scaled, config, loss_mask=mask)
    action_log_probs, base_action_log_probs, loss_mask = new_logp, ref_logp, mask
    self = SimpleNamespace(
        cfg=SimpleNamespace(
            algorithm=SimpleNamespace(use_kl_loss=kl_beta != 0.0, kl_estimator_type="k3", kl_loss_coef=kl_beta)
        )
    )
    # fmt: off
    # ---- verbatim: skyrl/backends/skyrl_train/workers/worker.py, lines 1070-1080 ----
    if self.cfg.algorithm.use_kl_loss:
        kl_loss = compute_approx_kl(
            action_log_probs,
            base_action_log_probs,
            loss_mask=loss_mask,
            kl_estimator_type=self.cfg.algorithm.kl_estimator_type,
        )
        kl_loss = masked_mean(kl_loss, loss_mask, dim=-1).mean()
    else:
        kl_loss = torch.tensor(0.0)
    kl_loss_term = kl_loss * self.cfg.algorithm.kl_loss_coef
    # ---- end of verbatim ----
    # fmt: on
    return policy_loss + kl_loss_term  # worker.py 1087 with dp_size 1, one micro-batch and no entropy term


ALGORITHM = AlgorithmSpec(
    advantage_scale="sample_std",  # torch.std
    std_eps=1e-6,
    singleton_groups="reward",  # mean 0, std 1
    advantage_dtype="float32",
    loss_aggregation="token_mean",  # loss_reduction="token_mean"
    kl_estimator="k3",
    kl_clamp=10.0,  # torch.clamp(kld, min=-10, max=10)
    kl_aggregation="sequence_mean",  # masked_mean(kl, loss_mask, dim=-1).mean()
    loss_dtype="float32",  # safe_exp_delta: the ratio in float32
)
"""SkyRL's GRPO choices under its default configuration, each read from the copied source (module docstring)."""

IMPL = Implementation(name=f"skyrl-{VERSION}", advantages=advantages, batch_loss=batch_loss, algorithm=ALGORITHM)
