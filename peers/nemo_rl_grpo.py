# ruff: noqa: F821, UP045, SIM108  (code copied verbatim: its own annotations and style)
"""NeMo-RL's GRPO advantages and KL penalty, copied verbatim (the library is not installable here: `nemo-rl` on PyPI
is an empty 0.0.0 placeholder) and bound for the conformance suite: `--rl-impl peers.nemo_rl_grpo:IMPL`.

Provenance: github.com/NVIDIA-NeMo/RL at commit 7ea279abfbeb698b092856d0dab61e7cf39bc909 (2026-08-22), Apache-2.0,
Copyright (c) 2025 NVIDIA CORPORATION. Copied verbatim, below the marker lines:

- `calculate_kl`, `calculate_baseline_and_std_per_prompt` and `masked_mean`: nemo_rl/algorithms/utils.py, lines
  42-101, 104-198 and 212-224;
- `GRPOAdvantageEstimator`: nemo_rl/algorithms/advantage_estimator.py, lines 57-98;
- in `batch_loss`, the statements between the marker comments: nemo_rl/algorithms/loss/loss_functions.py,
  `ClippedPGLossFn.__call__`, lines 484-501 (the KL weight and term), 506-509 (its token-level reduction), 527-540 and
  547-551 (the token ratio, its clamp and the clipped loss) and 678-683 (the actor loss's token-level reduction). The
  glue between them (names bound to the suite's tensors, the default configuration's branches taken) is ours.

NeMo-RL's choices under its defaults (`ClippedPGLossConfig`, `AdvEstimatorConfig`, examples/configs/grpo_math_1B.yaml),
declared as `ALGORITHM`:

    advantages   leave-one-out baseline (`use_leave_one_out_baseline: true`): r_i - mean of the others
                 std: the sample std of the others; divided by (std + 1e-6) where std > 0, not scaled where it is 0
                 a group of one: baseline = its reward, so 0; dtype: float32 rewards
    loss         token-level (`token_level_loss: True`): the batch's token mean (`global_valid_toks`)
                 clip: two-sided, ratio_clip_min = ratio_clip_max = 0.2; no dual clip (`ratio_clip_c: None`)
                 KL: `reference_policy_kl_penalty: 0.01`, k3 times `exp(curr - curr.detach())` (value 1): k3's value,
                 k2's gradient; output clamped to [-10, 10] after the weight (input clamp 20: beyond the laws' 8 nats)
"""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace
from typing import Optional

import torch
from torch import Tensor

from peers._adapt import check_pair
from rl.conformance import AlgorithmSpec, Implementation

__all__ = ["ALGORITHM", "IMPL", "advantages", "batch_loss"]

VERSION = "7ea279a"


# fmt: off
# ---- verbatim: nemo_rl/algorithms/utils.py, lines 42-101 -------------------------------------------------------------
def calculate_kl(
    logprobs: torch.Tensor,
    logprobs_reference: torch.Tensor,
    kl_type: str = "k3",
    input_clamp_value: float | None = 20.0,
    output_clamp_value: float | None = 10.0,
    importance_sampling_weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """Calculates a per-token estimate of the KL Divergence between two logprobs.

    From Schulman 2020, http://joschu.net/blog/kl-approx.html.

    Args:
        logprobs: torch.Tensor (b, s)
        logprobs_reference: torch.Tensor (b, s)
        kl_type: Type of KL approximation to use. Valid values: "k1", "k2", "k3".
        input_clamp_value: Optional clamping value for logr to prevent numerical instability.
                           If None, no clamping is applied.
        output_clamp_value: Optional clamping value for kl to prevent numerical instability.
                           If None, no clamping is applied.
        importance_sampling_weights: Optional per-token importance weights. When
                                     provided, weights are multiplied into the KL
                                     before output clamping. If input clamping
                                     applies to a token, the corresponding weight
                                     is detached so the clamp suppresses both KL
                                     and sampling-weight gradients.

    Returns:
        torch.Tensor: Per-token KL penalty values (b, s)
    """
    logr = logprobs_reference - logprobs
    if input_clamp_value is not None:
        logr_clamped = logr.clamp(min=-input_clamp_value, max=input_clamp_value)
        if importance_sampling_weights is not None:
            importance_sampling_weights = torch.where(
                logr == logr_clamped,
                importance_sampling_weights,
                importance_sampling_weights.detach(),
            )
        logr = logr_clamped

    if kl_type == "k1":
        kl = -logr

    elif kl_type == "k2":
        kl = torch.square(logr) / 2

    elif kl_type == "k3":
        kl = torch.exp(logr) - 1 - logr

    else:
        raise ValueError(f"Invalid KL type: {kl_type}")

    if importance_sampling_weights is not None:
        kl = importance_sampling_weights * kl

    if output_clamp_value is not None:
        kl = kl.clamp(min=-output_clamp_value, max=output_clamp_value)

    return kl


# ---- verbatim: nemo_rl/algorithms/utils.py, lines 104-198 ------------------------------------------------------------
def calculate_baseline_and_std_per_prompt(
    prompts: torch.Tensor,
    rewards: torch.Tensor,
    valid_mask: torch.Tensor,
    leave_one_out_baseline: bool = True,
    std_rewards: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Function to compute a baseline for each (prompt, response) pair in the batch.

    The same baseline is calculated for each prompt. Samples set to 0 in 'valid_mask'
    are not included in the baseline calculation.

    prompts:    tensor (b, s)     Tensor of prompts the model used. May be on any device
    rewards:    tensor (b,)       Float-valued rewards. May be on any device
    valid_mask: tensor (b,)       Vector of 0/1, where 0 is to ignore and 1 is to keep
    leave_one_out_baseline: bool  Compute an unbiased baseline by leaving out the sample that
                                  the baseline is for (from RLOO https://arxiv.org/abs/2402.14740)
    std_rewards: tensor (b,)      Optional separate reward tensor used only for the std
                                  calculation. Defaults to `rewards`. Useful for DAPO,
                                  which needs std on the raw task metric for dynamic
                                  sampling filtering while keeping baseline on the
                                  shaped reward.

    Returns:
    tensor (b,), tensor (b,) of baselines and std on the same device as 'rewards'
    """
    if std_rewards is None:
        std_rewards = rewards
    unique_prompts = torch.unique(prompts, dim=0)

    baseline = torch.zeros_like(rewards)
    sq_baseline = torch.zeros_like(rewards)
    std = torch.zeros_like(rewards)
    device_ordinal = rewards.get_device()
    if device_ordinal == -1:
        reward_device = torch.device("cpu")
    else:
        reward_device = torch.device(f"cuda:{device_ordinal}")

    for i in range(len(unique_prompts)):
        is_matching_prompt = (prompts == unique_prompts[i]).all(1)
        prompt_idx = torch.arange(len(prompts), device=reward_device)[
            is_matching_prompt
        ]

        if leave_one_out_baseline:
            baseline_mask_matrix = (1 - torch.eye(len(prompt_idx))).to(reward_device)
        else:
            baseline_mask_matrix = torch.ones((len(prompt_idx), len(prompt_idx))).to(
                reward_device
            )

        if valid_mask[prompt_idx].sum() <= 1:
            # Ignore sample: there are no valid responses, so set baseline equal to reward
            # to ignore it in the loss computation
            baseline[prompt_idx] = rewards[prompt_idx]
        else:
            num_valid = valid_mask[prompt_idx].float().sum() - int(
                leave_one_out_baseline
            )
            prompt_baseline = (
                torch.matmul(
                    baseline_mask_matrix, rewards[prompt_idx] * valid_mask[prompt_idx]
                )
                / num_valid
            )
            std_prompt_baseline = (
                prompt_baseline
                if std_rewards is rewards
                else torch.matmul(
                    baseline_mask_matrix,
                    std_rewards[prompt_idx] * valid_mask[prompt_idx],
                )
                / num_valid
            )
            std_prompt_baseline_square = (
                torch.matmul(
                    baseline_mask_matrix,
                    torch.pow(std_rewards[prompt_idx], 2) * valid_mask[prompt_idx],
                )
                / num_valid
            )

            baseline[prompt_idx] = prompt_baseline
            sq_baseline[prompt_idx] = std_prompt_baseline_square
            std[prompt_idx] = (
                (
                    (std_prompt_baseline_square - std_prompt_baseline.square())
                    * (num_valid / (num_valid - 1))
                )
                .sqrt()
                .nan_to_num(0)
            )

    return baseline, std


# ---- verbatim: nemo_rl/algorithms/utils.py, lines 212-224 ------------------------------------------------------------
def masked_mean(
    values: torch.Tensor,
    mask: torch.Tensor,
    dim: Optional[int] = None,
    global_normalization_factor: Optional[torch.Tensor | float] = None,
):
    """Computes the mean of a microbatch, using a global statistic as the normalization factor."""
    normalization_factor = (
        torch.sum(mask, dim=dim)
        if global_normalization_factor is None
        else global_normalization_factor
    )
    return torch.sum(values * mask, dim=dim) / (normalization_factor + 1e-8)


# ---- verbatim: nemo_rl/algorithms/advantage_estimator.py, lines 57-98 ------------------------------------------------
class GRPOAdvantageEstimator:
    """GRPO-style advantage estimator with leave-one-out baseline.

    Note: GRPO computes advantages over all responses for each prompt.
    """

    def __init__(
        self, estimator_config: AdvEstimatorConfig, loss_config: ClippedPGLossConfig
    ):
        self.use_leave_one_out_baseline = estimator_config.use_leave_one_out_baseline
        self.normalize_rewards = estimator_config.normalize_rewards

    def compute_advantage(self, prompt_ids, rewards, mask, **kwargs):
        """Compute GRPO advantages.

        Args:
            prompt_ids: Tensor of shape [batch_size] identifying which prompt each sample belongs to.
            rewards: Tensor of shape [batch_size] containing reward for each sample.
            mask: Response token mask of shape [batch_size, seq_len], 1 for valid response tokens, 0 for padding.
                  Used only for expanding advantages to token-level shape.
            **kwargs: Additional arguments (unused).

        Returns:
            Advantages tensor of shape [batch_size, seq_len].
        """
        baseline, std = calculate_baseline_and_std_per_prompt(
            prompt_ids,
            rewards,
            torch.ones_like(rewards),
            leave_one_out_baseline=self.use_leave_one_out_baseline,
        )
        advantages = (rewards - baseline).unsqueeze(-1)

        if self.normalize_rewards:
            # don't sharpen the ones with no variation
            epsilon = 1e-6
            non_zero_std_mask = std > 0
            advantages[non_zero_std_mask] = advantages[non_zero_std_mask] / (
                std.unsqueeze(-1)[non_zero_std_mask] + epsilon
            )

        return advantages.expand(mask.shape)
# fmt: on
# ---- end of verbatim copies -----------------------------------------------------------------------------------------


class LossType:
    """The one member of NeMo-RL's `LossType` enum the token-level branches below compare with."""

    TOKEN_LEVEL = "token_level"


# `ClippedPGLossConfig`'s defaults, as `ClippedPGLossFn.__init__` copies them onto `self` (loss_functions.py 120-160).
_CONFIG = {
    "reference_policy_kl_type": "k3",
    "kl_input_clamp_value": 20.0,
    "kl_output_clamp_value": 10.0,
    "ratio_clip_min": 0.2,
    "ratio_clip_max": 0.2,
    "loss_type": LossType.TOKEN_LEVEL,
}


def advantages(group_ids: Sequence[int], rewards: Sequence[float]) -> list[float]:
    """NeMo-RL's `GRPOAdvantageEstimator` (leave-one-out baseline, normalised) on float32 rewards, each group id as a
    one-token prompt (`calculate_baseline_and_std_per_prompt` groups samples by identical prompt rows)."""
    check_pair(group_ids, rewards)
    config = SimpleNamespace(use_leave_one_out_baseline=True, normalize_rewards=True)
    estimator = GRPOAdvantageEstimator(config, None)  # type: ignore[arg-type]
    prompt_ids = torch.tensor([[gid] for gid in group_ids], dtype=torch.int64)  # [B, 1]
    values = torch.tensor(list(rewards), dtype=torch.float32)  # [B]
    mask = torch.ones(len(rewards), 1)  # [B, 1]: one token each
    return estimator.compute_advantage(prompt_ids, values, mask)[:, 0].tolist()


def batch_loss(
    new_logp: Tensor,
    old_logp: Tensor,
    ref_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_eps: float = 0.2,
    kl_beta: float = 0.01,
) -> Tensor:
    """`ClippedPGLossFn.__call__`'s token-level clipped loss plus its KL term, under the default configuration, on
    given log-probs (no generation mismatch: generation = previous log-probs; no importance-sampling correction).

    Shape: `new_logp`, `old_logp`, `ref_logp`, `mask`: `[B, T]`; `advantages`: `[B]` -> loss `[]`.
    """
    self = SimpleNamespace(**_CONFIG, reference_policy_kl_penalty=kl_beta)
    self.ratio_clip_min = self.ratio_clip_max = clip_eps
    curr_logprobs = curr_logprobs_unfiltered = new_logp
    prev_logprobs, reference_policy_logprobs = old_logp, ref_logp
    advantages = advantages.unsqueeze(-1).expand(mask.shape)  # NeMo-RL's advantages are [B, T]
    global_valid_toks = mask.sum()
    # fmt: off
    # ---- verbatim: loss_functions.py, lines 488-493, 495-503, 506-509 (the KL weight, term and reduction) ----
    kl_importance_weights = torch.exp(
        curr_logprobs_unfiltered - curr_logprobs_unfiltered.detach()
    )
    kl_importance_weights = torch.nan_to_num(
        kl_importance_weights, nan=0.0, posinf=0.0, neginf=0.0
    )
    # Compute KL loss
    kl = self.reference_policy_kl_penalty * calculate_kl(
        logprobs=curr_logprobs_unfiltered,
        logprobs_reference=reference_policy_logprobs,
        kl_type=self.reference_policy_kl_type,
        input_clamp_value=self.kl_input_clamp_value,
        output_clamp_value=self.kl_output_clamp_value,
        importance_sampling_weights=kl_importance_weights,
    )
    if self.loss_type == LossType.TOKEN_LEVEL:
        kl = masked_mean(
            kl, mask, global_normalization_factor=global_valid_toks
        )
    # ---- verbatim: lines 527, 537-540, 548-552 (the token ratio, its clamp, the pessimistic loss) ----
    log_ratios = curr_logprobs - prev_logprobs
    ratios = log_ratios.exp()
    ratios_clamped = ratios.clamp(
        1.0 - self.ratio_clip_min, 1.0 + self.ratio_clip_max
    )
    loss1 = -advantages * ratios
    loss2 = -advantages * ratios_clamped

    # Determine which value to use for clipping (max for pessimistic estimate)
    clip_loss = torch.max(loss1, loss2)
    # ---- verbatim: line 676 (no importance-sampling correction by default), lines 678-683 ----
    importance_weights_to_use = torch.ones_like(prev_logprobs)
    if self.loss_type == LossType.TOKEN_LEVEL:
        actor_loss = masked_mean(
            importance_weights_to_use * clip_loss,
            mask,
            global_normalization_factor=global_valid_toks,
        )
    # ---- end of verbatim ----
    # fmt: on
    return actor_loss + kl


ALGORITHM = AlgorithmSpec(
    advantage_scale="sample_std",  # the others' std: torch's Bessel-corrected formula, num_valid / (num_valid - 1)
    advantage_baseline="leave_one_out",  # use_leave_one_out_baseline: true
    std_eps=1e-6,  # `std + epsilon`, epsilon = 1e-6, only where std > 0
    singleton_groups="zero",  # valid_mask.sum() <= 1: baseline = reward
    advantage_dtype="float32",
    loss_aggregation="token_mean",  # token_level_loss: True, normalised by global_valid_toks
    kl_estimator="k3_value_k2_grad",  # k3 times exp(curr - curr.detach())
    kl_clamp=10.0,  # kl_output_clamp_value, after the weight
    loss_dtype="float32",
)
"""NeMo-RL's GRPO choices under its default configuration, each read from the copied source (module docstring)."""

IMPL = Implementation(name=f"nemo-rl-{VERSION}", advantages=advantages, batch_loss=batch_loss, algorithm=ALGORITHM)
