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

import atexit
import functools
import os
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # `rollout_func` warns that it is experimental

import torch
import trl
from datasets import Dataset
from torch import Tensor
from trl import GRPOConfig, GRPOTrainer

from peers._adapt import check_pair, groups_by_size
from rl.conformance import AlgorithmSpec, Implementation
from rl.models.tiny import build_tiny_model, load_base_model, load_tokenizer

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
    "compute_loss",
]

VERSION = trl.__version__


def _rollout(prompts: list[Any], trainer: GRPOTrainer) -> dict[str, list[list[Any]]]:
    """TRL's `rollout_func` hook: one fixed prompt token and one fixed completion token per row; nothing is
    generated (the rewards under test do not depend on the text)."""
    n = len(prompts)
    return {"prompt_ids": [[2]] * n, "completion_ids": [[4]] * n, "logprobs": [[-1.0]] * n}


def _reward_column(completions: list[Any], reward: list[float], **_: Any) -> list[float]:
    """A TRL reward function returning the dataset column `reward`: the rewards under test, in row order."""
    return list(reward)


@functools.cache
def _trainer() -> GRPOTrainer:
    root = tempfile.mkdtemp(prefix="peers-trl-")
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    model_dir = build_tiny_model(os.path.join(root, "model"))
    args = GRPOConfig(
        output_dir=os.path.join(root, "out"),
        per_device_train_batch_size=8,  # the defaults otherwise: num_generations=8, loss_type="dapo", beta=0.0, ...
        report_to=[],
        use_cpu=True,
    )
    trainer = GRPOTrainer(
        model=load_base_model(model_dir),
        reward_funcs=[_reward_column],
        args=args,
        train_dataset=Dataset.from_dict({"prompt": ["a"] * 8}),
        processing_class=load_tokenizer(model_dir),
        rollout_func=_rollout,
    )
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1  # what Trainer sets for an accumulation window of one batch
    return trainer


def advantages(group_ids: Sequence[int], rewards: Sequence[float]) -> list[float]:
    """TRL's advantages of `rewards`, one per sample in input order.

    Each group size is one `_generate_and_score_completions` call with `num_generations` set to that size and the
    groups of that size laid out contiguously, as TRL's sampler lays them out; results are scattered back."""
    check_pair(group_ids, rewards)
    trainer = _trainer()
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
    trainer = _trainer()
    trainer.epsilon_low = trainer.epsilon_high = clip_eps
    trainer.beta = kl_beta
    return compute_loss(trainer, new_logp, old_logp, ref_logp, advantages, mask)


def compute_loss(
    trainer: GRPOTrainer, new_logp: Tensor, old_logp: Tensor, ref_logp: Tensor, advantages: Tensor, mask: Tensor
) -> tuple[Tensor, dict[str, float]]:
    """`trainer._compute_loss` on given log-probs, as the trainer is configured (clip, beta, loss type)."""
    # The model forward, replaced: TRL computes every other term from these log-probs.
    trainer._get_per_token_logps_and_entropies = lambda *a, **k: (new_logp, torch.zeros_like(new_logp).detach(), None)
    batch, length = new_logp.shape
    inputs = {
        "prompt_ids": torch.full((batch, 1), 2, dtype=torch.long),
        "prompt_mask": torch.ones(batch, 1, dtype=torch.long),
        "completion_ids": torch.full((batch, length), 4, dtype=torch.long),
        "completion_mask": mask.long(),
        "advantages": advantages,
        "old_per_token_logps": old_logp,
        "ref_per_token_logps": ref_logp,
        "num_items_in_batch": mask.sum(),
    }
    loss = trainer._compute_loss(trainer.model, inputs)
    return loss, {"loss": float(loss.detach())}


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

# The other configurations (GSPO, CISPO, a batch std) live in peers.trl_choices; `nox -s peers` names this module.
from peers.trl_choices import IMPL_BATCH_STD, IMPL_CISPO, IMPL_GSPO  # noqa: E402
