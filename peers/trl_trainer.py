"""One real TRL `GRPOTrainer` (`trl==1.16.0`) on our tiny offline model, and its `_compute_loss` on given log-probs:
what `peers.trl_grpo` and `peers.trl_choices` run TRL's own code through (`peers.trl_grpo`'s docstring says how).

The trainer is built once per process with TRL's default `GRPOConfig`; a binding that changes one of its settings
for a call sets it back after.
"""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import tempfile
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # `rollout_func` warns that it is experimental

import torch
import trl
from datasets import Dataset
from torch import Tensor
from trl import GRPOConfig, GRPOTrainer

from rl.models.opened_model import open_model
from rl.models.tiny import build_tiny_model, load_base_model, load_tokenizer

__all__ = ["VERSION", "compute_loss", "tiny_trainer"]

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
def tiny_trainer() -> GRPOTrainer:
    """The trainer, built on first use (TRL's default `GRPOConfig`, batches of 8, CPU, no reporting)."""
    root = tempfile.mkdtemp(prefix="peers-trl-")
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    model_dir = open_model(build_tiny_model(os.path.join(root, "model")))
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
