"""Held-out accuracy of a real model on `rl.problems.Addition`, sampled as `rl demo grpo --model` samples: its chat
template, temperature 1, 12 new tokens, stop at end-of-turn, answers scored as text by `rl.rewards.is_correct`; K
samples per held-out problem, problem i on seed 1000 + i, so two models are compared on the same draws.

Any causal LM module works (ours' `load_policy`, TRL's trained `PeftModel`): scripts/real_model_learning.py and
`nox -s bench-peers`'s real-model shape both evaluate with `heldout_accuracy`.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from rl.models.chat import decode_texts, encode_prompts
from rl.models.opened_model import ModelDir
from rl.problems import Addition
from rl.rewards import is_correct
from rl.samplers.decoding import sample_groups
from rl.storage.artifacts import LocalArtifacts
from rl.trainer.adapter import load_policy
from rl.types import ArtifactRef

__all__ = ["BATCH_PROBLEMS", "MAX_TOKENS", "heldout_accuracy", "trained_policy"]

MAX_TOKENS = 12  # the demo's on a real model (rl.deploy.demo.grpo_demo_config)
BATCH_PROBLEMS = 12  # problems decoded together: 12 x K rows a batch


def heldout_accuracy(model: Any, tokenizer: Any, samples: int) -> tuple[int, int]:
    """(correct, total) over `Addition`'s held-out problems, `samples` each."""
    prompts = Addition().eval_prompts()
    encoded = encode_prompts(tokenizer, [p.question for p in prompts])  # one request to the tokenizer's worker
    correct = total = 0
    for lo in range(0, len(prompts), BATCH_PROBLEMS):
        members = list(range(lo, min(lo + BATCH_PROBLEMS, len(prompts))))
        groups = sample_groups(
            model,
            [encoded[i] for i in members],
            ns=[samples] * len(members),
            max_tokens=MAX_TOKENS,
            seeds=[1000 + i for i in members],
            eos_token_id=int(tokenizer.eos_token_id),
        )
        for i, group in zip(members, groups, strict=True):
            for s in group:
                total += 1
                correct += is_correct(decode_texts(tokenizer, [s.token_ids])[0], prompts[i].answer)
    return correct, total


def trained_policy(run_dir: Path, model_dir: ModelDir) -> tuple[Any, int]:
    """(the frozen policy, its adapter version) of the last checkpoint of the `rl demo grpo` run in `run_dir`. Runs its
    own event loop: call it outside one."""
    state = json.loads((run_dir / "checkpoint.json").read_text())["state"]
    ref = state["adapter"]  # {"uri": ..., "digest": ...}
    files = asyncio.run(LocalArtifacts(run_dir / "artifacts").get(ArtifactRef(uri=ref["uri"], digest=ref["digest"])))
    return load_policy(model_dir, files, trainable=False), int(state["adapter_version"])
