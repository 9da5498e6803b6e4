# ruff: noqa: E501  (code copied verbatim: its own line lengths)
"""The Flyte tutorial's own GRPO advantages and loss (the training-loop tutorial, `rl_grpo_lora`), copied verbatim and
bound for the conformance suite as a peer: `--rl-impl peers.tutorial_grpo:IMPL`.

Provenance: github.com/unionai/unionai-examples, v2/tutorials/rl_grpo_lora/rl_grpo_lora.py, at the snapshot's commit
45e2810241defee0d6f7ba85925987decf4425df (the file last changed in 0c88448cd2d10f142eaf9efd3e0ffa3566b3993d). Copied
verbatim, between the marker lines:

- `_group_normalized_advantages`: lines 385-401 (the `advantages` docs fragment);
- in `batch_loss`, the statements of `train_step`'s per-rollout loop that make the loss: lines 445-447 (the skip of a
  zero advantage), 466 and 468 (the completion's token mean of log-probs, and `-advantage * seq_log_prob`). The
  tutorial calls `loss.backward()` per rollout and takes one optimizer step, so its gradient is that of the sum of
  the rollouts' losses, which `batch_loss` returns. The glue (each row of `new_logp` as the rollout's
  `token_log_probs`, the suite's mask as its `completion_mask`, `Rollout` reduced to its `group_id`) is ours.

The tutorial's choices, declared as `ALGORITHM`:

    advantages   (r - statistics.fmean) / (statistics.pstdev + 1e-4) in Python floats: the population std, eps on
                 the std, float64; a group of one: pstdev forced to 0 and r - mean = 0, so 0; no all-equal guard
    loss         REINFORCE on the completion's mean log-prob, `-A * mean_t(logp_t)`, per rollout, summed over the
                 batch (each `loss.backward()` accumulates): no ratio (`importance_ratio="on_policy"`: it never
                 sees the sampler's log-probs), no KL penalty (`kl_estimator="none"`), no clip
                 aggregation: each completion's token mean, summed over completions, a weight of 1/T_i: B times
                 `sequence_mean`'s 1/(B T_i), which no `AlgorithmSpec` declares (declared: "sequence_mean", the closest)
                 dtype: the model runs in bfloat16 (`torch_dtype=torch.bfloat16`), so do its log-probs
"""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import torch
from torch import Tensor

from peers._adapt import check_pair
from rl.conformance import AlgorithmSpec, Implementation

__all__ = ["ALGORITHM", "IMPL", "advantages", "batch_loss"]

VERSION = "45e2810"
Rollout = Any  # the tutorial's pydantic `Rollout`; only its `group_id` is read


# fmt: off
# ---- verbatim: v2/tutorials/rl_grpo_lora/rl_grpo_lora.py, lines 385-401 ---------------------------------------------
def _group_normalized_advantages(rollouts: list[Rollout], rewards: list[float]) -> list[float]:
    """GRPO advantage: within each prompt group, ``(r - mean) / (std + eps)``."""
    import statistics
    from collections import defaultdict

    by_group: dict[int, list[int]] = defaultdict(list)
    for i, r in enumerate(rollouts):
        by_group[r.group_id].append(i)

    advantages = [0.0] * len(rollouts)
    for idxs in by_group.values():
        group_rewards = [rewards[i] for i in idxs]
        mean = statistics.fmean(group_rewards)
        std = statistics.pstdev(group_rewards) if len(group_rewards) > 1 else 0.0
        for i in idxs:
            advantages[i] = (rewards[i] - mean) / (std + 1e-4)
    return advantages
# fmt: on
# ---- end of verbatim ---------------------------------------------------------------------------------------------------


def advantages(group_ids: Sequence[int], rewards: Sequence[float]) -> list[float]:
    """The tutorial's `_group_normalized_advantages`, each sample a rollout carrying its group id."""
    check_pair(group_ids, rewards)
    rollouts = [SimpleNamespace(group_id=gid) for gid in group_ids]
    return _group_normalized_advantages(rollouts, [float(r) for r in rewards])


def batch_loss(
    new_logp: Tensor,
    old_logp: Tensor,
    ref_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_eps: float = 0.2,
    kl_beta: float = 0.0,
) -> Tensor:
    """The loss whose gradient `train_step` accumulates over a batch: each rollout's `-advantage * seq_log_prob`,
    summed. It reads neither `old_logp`, `ref_logp`, `clip_eps` nor `kl_beta` (the tutorial has none of them).

    Shape: `new_logp`, `mask`: `[B, T]`; `advantages`: `[B]` -> loss `[]`.
    """
    losses = [new_logp.sum() * 0.0]  # a graph to return when every advantage is 0, as the tutorial then steps nothing
    for i, advantage in enumerate(advantages.tolist()):
        token_log_probs, completion_mask = new_logp[i : i + 1], mask[i : i + 1]  # (1, T): one rollout
        # fmt: off
        # ---- verbatim: lines 446-447, 466 and 468 ----
        if advantage == 0.0:
            continue  # no learning signal (whole group scored identically)
        seq_log_prob = (token_log_probs * completion_mask).sum() / completion_mask.sum().clamp(min=1.0)
        loss = -advantage * seq_log_prob
        # ---- end of verbatim ----
        # fmt: on
        losses.append(loss)  # the tutorial's `loss.backward()`: gradients accumulate across the batch
    return torch.stack(losses).sum()


ALGORITHM = AlgorithmSpec(
    loss_aggregation="sequence_mean",  # the closest declarable: the tutorial sums the token means (1/T_i)
    kl_estimator="none",  # no reference model, no KL term
    importance_ratio="on_policy",  # no old log-probs, no ratio
    loss_dtype="bfloat16",  # the model (and its log-probs) in bfloat16
)
"""The tutorial's choices (module docstring); its advantage choices are ours (population std, eps 1e-4 on the std)."""

IMPL = Implementation(name=f"tutorial-{VERSION}", advantages=advantages, batch_loss=batch_loss, algorithm=ALGORITHM)
