"""TRL's GRPO (`trl==1.16.0`, `trl.GRPOTrainer`) bound for the conformance suite: `--rl-impl peers.trl_grpo:IMPL`.

TRL has no pure advantage or loss function: both live inside `GRPOTrainer` (the advantages inline in
`_generate_and_score_completions`, the loss in `_compute_loss`). The smallest honest way to run TRL's own code on given
numbers is one real trainer, built once with TRL's default `GRPOConfig` on our tiny offline model
(`rl.models.tiny`), and:

- advantages: TRL's public `rollout_func` hook returns fixed one-token completions instead of generating, and a reward
  function returns the rewards under test (a dataset column, as TRL passes every column to reward functions). Then
  `trainer._generate_and_score_completions` runs unchanged and its `"advantages"` output is read back. TRL reshapes
  rewards to `[num_groups, num_generations]`, so groups are gathered by size and each size is one call with
  `trainer.num_generations` set to it (a one-sample group is the `num_generations == 1` case TRL handles in eval).
- loss: `trainer._compute_loss` runs unchanged on an `inputs` dict carrying the given old and reference log-probs,
  advantages and mask; the one thing replaced is the model forward, `trainer._get_per_token_logps_and_entropies`, which
  returns the given `new_logp` (so the gradient flows to it). `clip_eps` and `kl_beta` are set on the trainer's
  `epsilon_low`, `epsilon_high` and `beta`, the attributes `__init__` copies from `GRPOConfig`.

TRL's design choices under its default `GRPOConfig` (1.16.0), read from `trl/trainer/grpo_trainer.py` and declared
as `ALGORITHM`:

    advantages   A = (r - nanmean(r_g)) / (nanstd(r_g) + 1e-4), `scale_rewards="group"`
                 std: sample (Bessel, n - 1: `trl.trainer.utils.nanstd`); eps 1e-4 added to the std
                 dtype: float32 (rewards are cast with `torch.tensor(..., dtype=torch.float32)`)
                 all-equal group: no guard, so the float32 rounding residue of the mean is divided by ~1e-4
                 one-sample group: 0 (std forced to 0 when num_generations == 1, mean equals the reward)
    loss         `loss_type="dapo"`: token losses summed over the batch and divided by `num_items_in_batch`, the
                 completion tokens of the generation batch (`token_mean`; bound as `batch_loss`)
                 clip: two-sided PPO clip min(r A, clip(r, 1 - eps_low, 1 + eps_high) A), eps 0.2
                 KL: `beta=0.0` by default (no reference model loaded): declared "none". With beta > 0
                 (`ALGORITHM_KL`) the k3 term is multiplied by the importance ratio (`use_bias_correction_kl=True`),
                 whose gradient at ratio 1 is k2's while its value is k3's: declared "k3_ratio"
                 off-policy: yes (uses old_per_token_logps when given; on-policy it uses new.detach())
                 dtype: its log-probs' (float32 advantages); declared float32
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from torch import Tensor

from peers._adapt import check_pair, groups_by_size
from peers.trl_choices import CISPO_EPSILON_HIGH, batch_std_advantages, configured_loss
from peers.trl_trainer import VERSION, compute_loss, tiny_trainer
from rl.conformance import AlgorithmSpec, Implementation

__all__ = [
    "ALGORITHM",
    "ALGORITHM_KL",
    "IMPL",
    "IMPL_BATCH_STD",
    "IMPL_CISPO",
    "IMPL_GSPO",
    "IMPL_KL",
    "advantages",
    "batch_loss",
]


def advantages(group_ids: Sequence[int], rewards: Sequence[float]) -> list[float]:
    """TRL's advantages of `rewards`, one per sample in input order.

    Each group size is one `_generate_and_score_completions` call with `num_generations` set to that size and the
    groups of that size laid out contiguously, as TRL's sampler lays them out; results are scattered back."""
    check_pair(group_ids, rewards)
    trainer = tiny_trainer()
    out = [0.0] * len(rewards)
    for size, groups in groups_by_size(group_ids).items():
        order = [i for idx in groups for i in idx]
        trainer.num_generations = size
        scored = trainer._generate_and_score_completions([{"prompt": "a", "reward": rewards[i]} for i in order])
        for i, a in zip(order, scored["advantages"].tolist(), strict=True):
            out[i] = a
    return out


def batch_loss(
    new_logp: Tensor,
    old_logp: Tensor,
    ref_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_eps: float = 0.2,
    kl_beta: float = 0.03,
) -> tuple[Tensor, dict[str, float]]:
    """TRL's `_compute_loss` on given log-probs.

    Shape: `new_logp`, `old_logp`, `ref_logp`, `mask`: `[B, T]`; `advantages`: `[B]` -> loss `[]`.
    """
    trainer = tiny_trainer()
    trainer.epsilon_low = trainer.epsilon_high = clip_eps
    trainer.beta = kl_beta
    return compute_loss(trainer, new_logp, old_logp, ref_logp, advantages, mask)


ALGORITHM = AlgorithmSpec(
    advantage_scale="sample_std",  # nanstd: Bessel's n - 1
    std_eps=1e-4,  # `advantages / (std_rewards + 1e-4)`
    std_eps_placement="std",
    singleton_groups="zero",  # num_generations == 1: std forced to 0, r - mean == 0 exactly
    advantage_dtype="float32",  # rewards_per_func = torch.zeros(...): float32
    loss_aggregation="token_mean",  # loss_type="dapo": sum over the batch's tokens / num_items_in_batch
    kl_estimator="none",  # beta=0.0 by default (ALGORITHM_KL: beta > 0)
    importance_ratio="clipped",  # two-sided clip, epsilon 0.2 (stale samples when num_iterations > 1)
    loss_dtype="float32",  # the dtype of its advantages and of a float32 model's log-probs
)
"""TRL 1.16.0's GRPO choices under its default `GRPOConfig`, each read from its source (module docstring)."""

ALGORITHM_KL = replace(ALGORITHM, kl_estimator="k3_ratio")
"""The same with `beta > 0`: k3 times the importance ratio, not detached (`use_bias_correction_kl=True`)."""

IMPL = Implementation(name=f"trl-{VERSION}", advantages=advantages, batch_loss=batch_loss, algorithm=ALGORITHM)
IMPL_KL = Implementation(name=f"trl-{VERSION}-kl", advantages=advantages, batch_loss=batch_loss, algorithm=ALGORITHM_KL)

# TRL's other configurations, through the adapters of peers.trl_choices (whose docstring says what each runs), bound
# here beside the default because `nox -s peers` names this module.
ALGORITHM_GSPO = replace(ALGORITHM, importance_ratio="sequence", loss_aggregation="sequence_mean")
ALGORITHM_CISPO = replace(ALGORITHM, importance_ratio="cispo", ratio_cap=CISPO_EPSILON_HIGH)
ALGORITHM_BATCH_STD = replace(ALGORITHM, std_scope="batch")

IMPL_GSPO = Implementation(
    name=f"trl-{VERSION}-gspo", batch_loss=configured_loss("grpo", "sequence", None), algorithm=ALGORITHM_GSPO
)
IMPL_CISPO = Implementation(
    name=f"trl-{VERSION}-cispo",
    batch_loss=configured_loss("cispo", "token", CISPO_EPSILON_HIGH),
    algorithm=ALGORITHM_CISPO,
)
IMPL_BATCH_STD = Implementation(
    name=f"trl-{VERSION}-batch-std", advantages=batch_std_advantages, algorithm=ALGORITHM_BATCH_STD
)
