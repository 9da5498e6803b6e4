"""TRL 1.16.0's other GRPO configurations, run like `peers.trl_grpo`'s default (the same trainer, TRL's own code run on
given numbers): the adapters, which `peers.trl_grpo` binds with the choice each makes declared, as
`--rl-impl peers.trl_grpo:IMPL_GSPO` (`nox -s peers` names `peers.trl_grpo`).

- `IMPL_GSPO`: `importance_sampling_level="sequence"` with `loss_type="grpo"` (the GSPO paper's setup, which TRL's
  warning recommends): `log_importance_weights = (log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)`, one ratio
  per completion, clipped two-sided, per-completion token means. Declared `importance_ratio="sequence"`,
  `loss_aggregation="sequence_mean"`.
- `IMPL_CISPO`: `loss_type="cispo"`, `epsilon_high=5.0` (TRL's recommended value for it):
  `-torch.clamp(coef_1, max=epsilon_high).detach() * advantages * per_token_logps`, divided by the batch's tokens.
  Declared `importance_ratio="cispo"`, `ratio_cap=5.0`, `loss_aggregation="token_mean"`.
- `IMPL_BATCH_STD`: `scale_rewards="batch"`: the group's `nanmean`, the batch's `nanstd`, `+ 1e-4`. TRL lays a batch
  out as `[num_groups, num_generations]`, so this adapter pads every group to the largest size with rows whose reward
  function returns None, which TRL marks unscorable (NaN, left out of its nan-aware mean and std, advantage 0): one
  call sees the whole batch, as TRL's batch std must. Declared `std_scope="batch"` (with TRL's other advantage
  choices).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import Tensor

from peers._adapt import check_pair, groups_by_size
from peers.trl_trainer import compute_loss, tiny_trainer

__all__ = ["CISPO_EPSILON_HIGH", "batch_std_advantages", "configured_loss"]

CISPO_EPSILON_HIGH = 5.0


def configured_loss(loss_type: str, level: str, epsilon_high: float | None) -> Any:
    """TRL's loss under `loss_type`, `importance_sampling_level=level` and (CISPO) `epsilon_high`, as a `batch_loss`."""

    def loss(
        new_logp: Tensor,
        old_logp: Tensor,
        ref_logp: Tensor,
        advantages: Tensor,
        mask: Tensor,
        *,
        clip_eps: float = 0.2,
        kl_beta: float = 0.03,
    ) -> tuple[Tensor, dict[str, float]]:
        """TRL's `_compute_loss` with its `loss_type` and `importance_sampling_level` (and CISPO's `epsilon_high`, its
        ratio bound, in place of clip_eps) set on the trainer, as `GRPOTrainer.__init__` copies them from its config."""
        trainer = tiny_trainer()
        trainer.loss_type, trainer.importance_sampling_level = loss_type, level
        trainer.epsilon_low, trainer.epsilon_high = clip_eps, clip_eps if epsilon_high is None else epsilon_high
        trainer.beta = kl_beta
        try:
            return compute_loss(trainer, new_logp, old_logp, ref_logp, advantages, mask)
        finally:
            trainer.loss_type, trainer.importance_sampling_level = "dapo", "token"

    return loss


def batch_std_advantages(group_ids: Sequence[int], rewards: Sequence[float]) -> list[float]:
    """TRL's advantages under `scale_rewards="batch"`, one call for the whole batch: each group padded to the largest
    group's size with unscorable rows (reward None), which TRL leaves out of its nan-aware mean and std."""
    check_pair(group_ids, rewards)
    trainer = tiny_trainer()
    groups = [idx for bucket in groups_by_size(group_ids).values() for idx in bucket]
    size = max(len(idx) for idx in groups)
    rows: list[dict[str, Any]] = []
    slots: list[int | None] = []
    for idx in groups:
        for k in range(size):
            i = idx[k] if k < len(idx) else None
            rows.append({"prompt": "a", "reward": rewards[i] if i is not None else None})
            slots.append(i)
    trainer.num_generations, trainer.scale_rewards = size, "batch"
    try:
        scored = trainer._generate_and_score_completions(rows)
    finally:
        trainer.scale_rewards = "group"
    out = [0.0] * len(rewards)
    for i, a in zip(slots, scored["advantages"].tolist(), strict=True):
        if i is not None:
            out[i] = a
    return out
