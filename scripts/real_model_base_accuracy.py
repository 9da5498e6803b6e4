"""The base model's held-out accuracy on `rl.problems.Addition`, sampled as the demo samples (temperature 1, its chat
template, stop at end-of-turn, 12 new tokens, answers scored as text by rl.rewards), K samples per held-out problem.

    python scripts/real_model_base_accuracy.py [--model smollm2|DIR] [--samples 4]
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

from rl.engines.decoding import sample_groups
from rl.models import load_base_model, load_tokenizer
from rl.models.chat import encode_prompt
from rl.models.pretrained import resolve_model
from rl.problems import Addition
from rl.rewards import is_correct


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--samples", type=int, default=4)
    args = parser.parse_args()
    torch.set_num_threads(2)
    model_dir = resolve_model(args.model)
    model, tokenizer = load_base_model(model_dir), load_tokenizer(model_dir)
    prompts = Addition().eval_prompts()
    encoded = [encode_prompt(tokenizer, p.question) for p in prompts]
    correct = total = 0
    started = time.perf_counter()
    for lo in range(0, len(prompts), 12):  # 12 problems x K samples per batch
        members = list(range(lo, min(lo + 12, len(prompts))))
        groups = sample_groups(
            model,
            [encoded[i] for i in members],
            ns=[args.samples] * len(members),
            max_tokens=12,
            seeds=[1000 + i for i in members],
            eos_token_id=int(tokenizer.eos_token_id),
        )
        for i, group in zip(members, groups, strict=True):
            for s in group:
                total += 1
                correct += is_correct(tokenizer.decode(s.token_ids, skip_special_tokens=True), prompts[i].answer)
    print(f"base held-out accuracy {correct / total:.3f} ({correct}/{total}) in {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
