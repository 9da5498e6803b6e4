"""The ranks' side of the DDP shard-step law (`rl.conformance.ddp_shard_step_contract`): its inputs and the function
each spawned rank runs.

Module-level so that spawned ranks can unpickle it. It imports torch, so only the law's body imports this module: the
contract modules themselves stay importable without torch.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import random
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from rl.models import load_base_model
from rl.models.opened_model import ModelDir, open_model
from rl.seeding import derive_seed
from rl.trainer.adapter import adapter_files, new_adapter
from rl.trainer.config import TrainerConfig
from rl.trainer.ddp import shard
from rl.trainer.ddp_check import ShardStep, shard_step_report
from rl.types import ArtifactRef, Rollout, TrainBatch

CONFIG = TrainerConfig(lora_rank=4, lora_alpha=8, seed=3, threads=1)
GROUPS, SAMPLES = 3, 4
TOKEN_LOW, TOKEN_HIGH = 4, 40
"""Completion token ids are drawn from [4, 40): ordinary characters of the tiny tokenizer, in any real vocabulary."""

CASES: tuple[tuple[str, tuple[int, ...]], ...] = (
    ("even", (0, 1, 4, 5)),  # 2 + 2 samples
    ("uneven", (0, 4, 8)),  # 2 + 1
    ("empty-shard", (6,)),  # 1 + 0: rank 1's shard is empty
)
"""(name, contributing sample indices) on 2 ranks, the empty shard last: a rank that deadlocks there cannot hide the
results of the cases before it."""


def law_inputs(base_dir: Path, seed: int) -> tuple[dict[str, bytes], TrainBatch]:
    """A version-0 adapter's files and a batch of `GROUPS` x `SAMPLES` rollouts on the base model in `base_dir`.

    The completions are random tokens (2-5 of them), their sampling log-probs the base model's teacher-forced ones (a
    version-0 adapter is the identity), and the rewards a seeded permutation of four distinct values in every group, so
    every advantage is non-zero and every sample contributes a gradient.
    """
    from rl.samplers.decoding import teacher_forced_logprobs

    rng = random.Random(derive_seed("conformance.ddp.batch", seed))
    opened = open_model(base_dir, tokenizer=False)
    base = load_base_model(opened)
    rollouts: list[Rollout] = []
    rewards: list[float] = []
    for g in range(GROUPS):
        prompt = [2, TOKEN_LOW + g, TOKEN_LOW + 11]
        group_rewards = [0.0, 0.25, 0.5, 1.0][:SAMPLES]
        rng.shuffle(group_rewards)
        rewards += group_rewards
        for j in range(SAMPLES):
            completion = [rng.randrange(TOKEN_LOW, TOKEN_HIGH) for _ in range(rng.randint(2, 5))]
            with torch.no_grad():
                logprobs = teacher_forced_logprobs(base, prompt, completion).tolist()  # [T]
            rollouts.append(
                Rollout(
                    group_id=g,
                    question=f"{g}=",
                    answer=str(g + 1),
                    completion="",
                    prompt_token_ids=prompt,
                    token_ids=completion,
                    logprobs=logprobs,
                    policy_version=0,
                    seed=derive_seed("conformance.ddp.rollout", seed, g, j),
                )
            )
    adapter = adapter_files(new_adapter(opened, CONFIG, derive_seed("conformance.ddp.adapter", seed)))
    opened.close()
    batch = TrainBatch(
        step=0,
        rollouts=rollouts,
        rewards=rewards,
        adapter=ArtifactRef(uri="unused://", digest="sha256:" + "0" * 64),
        optimizer_state=None,
        new_version=1,
    )
    return adapter, batch


def shard_step_cases(
    rank: int,
    world_size: int,
    base_dir: Path,
    adapter: dict[str, bytes],
    batch: TrainBatch,
    cases: Sequence[tuple[str, Sequence[int]]],
    step_fn: ShardStep,
) -> list[dict[str, Any]]:
    """This rank's `shard_step_report` of each case in order, as `{"case": name, **report}`.

    A case that raises (a collective that timed out, a gloo error, the step's own exception) is recorded as
    `{"case": name, "shard": ..., "error": traceback}` and ends the run: the process group is no longer trustworthy.
    """
    results: list[dict[str, Any]] = []
    opened: ModelDir | None = None
    for name, indices in cases:
        try:
            opened = opened or open_model(base_dir, tokenizer=False)  # this rank's process opens the base, once
            report = shard_step_report(
                rank,
                world_size,
                opened,
                adapter,
                batch,
                CONFIG,
                [(name, indices)],
                torch.device("cpu"),
                step_fn=step_fn,
            )
        except Exception:
            results.append({"case": name, "shard": shard(indices, rank, world_size), "error": traceback.format_exc()})
            break
        results.append({"case": name, **report[name]})
    return results
