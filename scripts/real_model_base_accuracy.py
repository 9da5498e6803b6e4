"""The base model's held-out accuracy on `rl.problems.Addition`, sampled as the demo samples (temperature 1, its chat
template, stop at end-of-turn, 12 new tokens, answers scored as text by rl.rewards), K samples per held-out problem;
with `--run DIR`, also the adapter a `rl demo grpo --model` run in DIR last checkpointed, on the same seeds, and the
two-proportion z-test of the difference.

    python scripts/real_model_base_accuracy.py [--model smollm2|DIR] [--samples 4] [--run RUN_DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

from rl.engines.decoding import sample_groups
from rl.models import load_base_model, load_tokenizer
from rl.models.chat import encode_prompt
from rl.models.pretrained import resolve_model
from rl.problems import Addition
from rl.rewards import is_correct


def accuracy(model: Any, tokenizer: Any, samples: int) -> tuple[int, int]:
    prompts = Addition().eval_prompts()
    encoded = [encode_prompt(tokenizer, p.question) for p in prompts]
    correct = total = 0
    for lo in range(0, len(prompts), 12):  # 12 problems x K samples per batch
        members = list(range(lo, min(lo + 12, len(prompts))))
        groups = sample_groups(
            model,
            [encoded[i] for i in members],
            ns=[samples] * len(members),
            max_tokens=12,
            seeds=[1000 + i for i in members],
            eos_token_id=int(tokenizer.eos_token_id),
        )
        for i, group in zip(members, groups, strict=True):
            for s in group:
                total += 1
                correct += is_correct(tokenizer.decode(s.token_ids, skip_special_tokens=True), prompts[i].answer)
    return correct, total


def two_proportion_p(a: int, n: int, b: int, m: int) -> float:
    """One-sided p-value that proportion b/m exceeds a/n (pooled two-proportion z-test)."""
    pooled = (a + b) / (n + m)
    se = math.sqrt(pooled * (1 - pooled) * (1 / n + 1 / m))
    z = (b / m - a / n) / se if se > 0 else 0.0
    return 0.5 * math.erfc(z / math.sqrt(2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--run", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(2)
    model_dir = resolve_model(args.model)
    model, tokenizer = load_base_model(model_dir), load_tokenizer(model_dir)
    started = time.perf_counter()
    a, n = accuracy(model, tokenizer, args.samples)
    print(f"base held-out accuracy {a / n:.3f} ({a}/{n}) in {time.perf_counter() - started:.1f} s", flush=True)
    if args.run is None:
        return
    from rl.artifacts import LocalArtifacts
    from rl.trainer.adapter import load_policy
    from rl.types import ArtifactRef

    state = json.loads((args.run / "checkpoint.json").read_text())["state"]
    ref = state["adapter"]  # {"uri": ..., "digest": ...}
    files = asyncio.run(LocalArtifacts(args.run / "artifacts").get(ArtifactRef(uri=ref["uri"], digest=ref["digest"])))
    policy = load_policy(model_dir, files, trainable=False)
    started = time.perf_counter()
    b, m = accuracy(policy, tokenizer, args.samples)
    print(
        f"adapter v{state['adapter_version']} held-out accuracy {b / m:.3f} ({b}/{m}) in "
        f"{time.perf_counter() - started:.1f} s; one-sided two-proportion p = {two_proportion_p(a, n, b, m):.3g}"
    )


if __name__ == "__main__":
    main()
