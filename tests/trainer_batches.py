"""Synthetic GRPO batches on the tiny model for the trainer tests (imported by test modules from tests/ on sys.path).

The sampling log-probs are computed here independently of `rl.samplers` (one full forward, log-softmax, gather), as the
base model's teacher-forced log-probs: a version-0 adapter is the identity (PEFT initialises LoRA's B to zero), so these
are exactly what a sampler of version 0 would have recorded, and the first step's importance ratios are 1.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import random
from collections.abc import Sequence
from pathlib import Path

import torch

from rl.models import load_base_model
from rl.models.opened_model import open_model
from rl.trainer.config import TrainerConfig
from rl.types import ArtifactRef, Rollout, TrainBatch

REAL_FAMILY_TRAINER = TrainerConfig(
    lora_rank=4,
    lora_alpha=8,
    lr=1e-3,
    seed=3,
    target_modules=("k_proj", "o_proj", "q_proj", "v_proj"),
    base_dtype="bfloat16",
    attention="sdpa",
    gradient_checkpointing=True,
    micro_batch_size=2,
)
"""What a real model family trains with: bfloat16 base, float32 LoRA on the attention projections, sdpa, checkpointing,
micro-batches (the single-process and the DDP step are both checked with it)."""

VOCAB_LOW, VOCAB_HIGH = 4, 40  # ordinary characters of the tiny tokenizer (ids 0-3 are special)


def base_logprobs(model: torch.nn.Module, prompt_ids: Sequence[int], completion_ids: Sequence[int]) -> list[float]:
    """log p(completion_t | prompt, completion_<t) under `model`, by one teacher-forced forward.

    Shape: returns T = len(completion_ids) floats.
    """
    ids = torch.tensor([list(prompt_ids) + list(completion_ids)])  # [1, P+T]
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()  # [P+T, V]
    logp = torch.log_softmax(logits[len(prompt_ids) - 1 : -1], dim=-1)  # [T, V]
    return logp.gather(1, torch.tensor(completion_ids).unsqueeze(1)).squeeze(1).tolist()


def make_rollouts(
    base_dir: Path,
    *,
    groups: int,
    samples: int,
    policy_version: int = 0,
    seed: int = 0,
) -> list[Rollout]:
    """`groups` x `samples` rollouts in canonical order, with random completions of 2-5 tokens and base log-probs."""
    rng = random.Random(seed)
    model = load_base_model(open_model(base_dir, tokenizer=False))
    rollouts = []
    for g in range(groups):
        prompt = [2, VOCAB_LOW + g % 10, VOCAB_LOW + 11]  # <bos> digit '='
        for j in range(samples):
            completion = [rng.randrange(VOCAB_LOW, VOCAB_HIGH) for _ in range(rng.randint(2, 5))]
            rollouts.append(
                Rollout(
                    group_id=g,
                    question=f"{g % 10}=",
                    answer=str((g + 1) % 10),
                    completion="",
                    prompt_token_ids=prompt,
                    token_ids=completion,
                    logprobs=base_logprobs(model, prompt, completion),
                    policy_version=policy_version,
                    seed=seed * 1000 + g * 100 + j,
                )
            )
    return rollouts


def varied_rewards(rollouts: Sequence[Rollout], silent_groups: Sequence[int] = ()) -> list[float]:
    """Rewards that differ within every group except `silent_groups`, whose members all get 0.5.

    For groups of up to 4 consecutive samples the rewards are distinct powers of two over 8, so no member equals its
    group's mean and every advantage outside the silent groups is non-zero.
    """
    return [
        0.5 if r.group_id in silent_groups else 2.0 ** ((i * 7 + r.group_id) % 4) / 8.0 for i, r in enumerate(rollouts)
    ]


def make_batch(
    rollouts: list[Rollout],
    rewards: list[float],
    adapter: ArtifactRef,
    optimizer_state: ArtifactRef | None,
    *,
    step: int = 0,
    new_version: int = 1,
) -> TrainBatch:
    return TrainBatch(
        step=step,
        rollouts=rollouts,
        rewards=rewards,
        adapter=adapter,
        optimizer_state=optimizer_state,
        new_version=new_version,
    )
