"""transformers' forward against `rl.samplers.fast_forward.causal_lm_forward` on the tiny demo shape.

    .nox/unit/bin/python scripts/bench_fast_forward.py --attention eager

One torch thread, CPU time (the machine may be shared), the two interleaved, the minimum over repeats: a no-grad
forward of [16, 6]; a left-padded prefill of [64, 20] and two decode steps; a LoRA micro-batch ([16, 26]: a no-grad
forward, a forward and its backward).
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

from rl.models.tiny import TinyModelConfig, build_tokenizer, qwen2_config
from rl.samplers.fast_forward import causal_lm_forward

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def transformers_forward(model: torch.nn.Module, **kwargs: Any) -> Any:
    return model(**kwargs)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--attention", choices=["eager", "sdpa"], default="eager")
    p.add_argument("--repeats", type=int, default=10)
    args = p.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    config = qwen2_config(TinyModelConfig(), build_tokenizer())  # the demo's shape
    model = AutoModelForCausalLM.from_config(config, attn_implementation=args.attention).eval()
    lora = LoraConfig(r=8, target_modules=TARGETS, task_type="CAUSAL_LM")
    peft = get_peft_model(AutoModelForCausalLM.from_config(config, attn_implementation=args.attention), lora)
    small = torch.randint(0, 50, (16, 6))
    rows, width = 64, 20
    ids = torch.randint(0, 50, (rows, width))
    mask = torch.ones(rows, width, dtype=torch.long)
    mask[::2, :3] = 0
    positions = (mask.cumsum(1) - 1).clamp(min=0)
    batch = torch.randint(0, 50, (16, 26))

    def forward(run: Callable[..., Any]) -> None:
        with torch.no_grad():
            run(model, input_ids=small, use_cache=False)

    def decode(run: Callable[..., Any]) -> None:
        with torch.inference_mode():
            out = run(model, input_ids=ids, use_cache=True, attention_mask=mask, position_ids=positions)
            seen, at = mask, positions[:, -1:] + 1
            for _ in range(2):
                seen = torch.cat([seen, torch.ones(rows, 1, dtype=torch.long)], 1)
                nxt = out.logits[:, -1:].argmax(-1)
                out = run(model, input_ids=nxt, use_cache=True, cache=out.cache, attention_mask=seen, position_ids=at)
                at = at + 1

    def train(run: Callable[..., Any]) -> None:
        with torch.no_grad():
            run(peft, input_ids=batch, use_cache=False, logits_to_keep=10)
        run(peft, input_ids=batch, use_cache=False, logits_to_keep=10).logits.sum().backward()

    sides = {"transformers": transformers_forward, "written out": causal_lm_forward}
    for name, job, calls in (
        ("forward [16, 6]", forward, 100),
        ("prefill+2 decodes", decode, 20),
        ("LoRA step", train, 20),
    ):
        best = dict.fromkeys(sides, float("inf"))
        for _ in range(args.repeats):
            for side, run in sides.items():
                start = time.process_time()
                for _ in range(calls):
                    job(run)
                best[side] = min(best[side], (time.process_time() - start) / calls * 1e3)
        ours, theirs = best["written out"], best["transformers"]
        print(f"{args.attention} {name}: transformers {theirs:.3f} ms, written out {ours:.3f} ms ({ours / theirs:.2f})")


if __name__ == "__main__":
    main()
