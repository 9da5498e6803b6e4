"""The learning benchmark on a real model: held-out accuracy on `rl.problems.Addition` of the base model and of the
adapter a `rl demo grpo --model` run trained, sampled as the demo samples (temperature 1, its chat template, stop at
end-of-turn, 12 new tokens, answers scored as text by rl.rewards), K samples per held-out problem on the same seeds
for both, and the two-proportion z-test of the difference (docs/benchmarks.md).

    python scripts/real_model_learning.py --iterations 20 --out RUN_DIR [--engine torch|vllm] [--seed N] [--samples 8]
    python scripts/real_model_learning.py --run RUN_DIR     # a run already trained: evaluate its last checkpoint
    python scripts/real_model_learning.py                   # the base model alone
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

from rl.bench.heldout import heldout_accuracy, trained_policy
from rl.metrics import two_proportion_p
from rl.models import load_base_model, load_tokenizer
from rl.models.pretrained import resolve_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--samples", type=int, default=8, help="per held-out problem (36 problems)")
    parser.add_argument("--run", type=Path, default=None, help="a trained run's --out directory")
    parser.add_argument("--iterations", type=int, default=None, help="train first: rl demo grpo --iterations N")
    parser.add_argument("--out", type=Path, default=None, help="with --iterations: the run's directory")
    parser.add_argument("--engine", default="torch", help="with --iterations: the demo's --engine")
    parser.add_argument("--seed", type=int, default=0, help="with --iterations: the demo's run --seed")
    args = parser.parse_args()
    if args.iterations is not None:
        if args.out is None or args.run is not None:
            parser.error("--iterations trains into --out (and evaluates it); leave out --run")
        train = [
            "-m",
            "rl.cli",
            "demo",
            "grpo",
            "--model",
            args.model,
            "--engine",
            args.engine,
            "--seed",
            str(args.seed),
        ]
        started = time.perf_counter()
        subprocess.run(
            [sys.executable, *train, "--iterations", str(args.iterations), "--out", str(args.out), "--fresh"],
            check=True,
        )
        print(
            f"trained {args.iterations} iterations ({args.engine}) in {time.perf_counter() - started:.0f} s", flush=True
        )
        args.run = args.out
    torch.set_num_threads(2)
    model_dir = resolve_model(args.model)
    model, tokenizer = load_base_model(model_dir), load_tokenizer(model_dir)
    started = time.perf_counter()
    a, n = heldout_accuracy(model, tokenizer, args.samples)
    print(f"base held-out accuracy {a / n:.3f} ({a}/{n}) in {time.perf_counter() - started:.1f} s", flush=True)
    if args.run is None:
        return
    policy, version = trained_policy(args.run, model_dir)
    started = time.perf_counter()
    b, m = heldout_accuracy(policy, tokenizer, args.samples)
    print(
        f"adapter v{version} held-out accuracy {b / m:.3f} ({b}/{m}) in "
        f"{time.perf_counter() - started:.1f} s; two-sided two-proportion p = {two_proportion_p(a, n, b, m):.3g}"
    )


if __name__ == "__main__":
    main()
