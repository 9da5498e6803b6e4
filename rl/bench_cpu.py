"""CPU figures for the real stack on the tiny model: sampler tokens/s, its teacher-forced ceiling, train-step seconds.

The sampler decodes one token per forward for a group; a teacher-forced forward scores every token of the same
sequences at once, so its tokens/s is the sampler's ceiling on this machine and the ratio says how far decoding is
from it.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from rl.artifacts import LocalArtifacts
from rl.engines.torch_sampler import TorchSampler, batched_teacher_forced_logprobs
from rl.local import DEMO_MODEL, DEMO_TRAINER, base_model
from rl.loop.grpo import GrpoConfig, GrpoTiers, generate_and_score
from rl.problems import DigitSuccessor
from rl.scoring import RewardScorer
from rl.trainer.peft_trainer import PeftTrainer
from rl.types import TrainBatch


async def _measure(root: Path, groups: int, group_size: int, max_tokens: int, steps: int) -> dict[str, Any]:
    base = base_model(root, DEMO_MODEL)
    artifacts = LocalArtifacts(root / "artifacts")
    trainer = PeftTrainer(base, artifacts, DEMO_TRAINER)
    sampler = TorchSampler(base, artifacts, threads=DEMO_TRAINER.threads)
    init = await trainer.init_adapter(0)
    config = GrpoConfig(prompts_per_iteration=groups, group_size=group_size, max_tokens=max_tokens)
    tiers = GrpoTiers(sampler, RewardScorer(), trainer, artifacts, DigitSuccessor())

    await generate_and_score(config, tiers, 0, init.adapter, 0)  # warm: adapter load, first-call overheads
    start = time.perf_counter()
    rollouts, _ = await generate_and_score(config, tiers, 1, init.adapter, 0)
    sample_s = time.perf_counter() - start
    sampled_tokens = sum(len(r.token_ids) for r in rollouts)

    model = await sampler.policy(init.adapter)
    prompts, completions = [r.prompt_token_ids for r in rollouts], [r.token_ids for r in rollouts]
    pad = int(sampler.tokenizer.pad_token_id or 0)
    with torch.no_grad():
        batched_teacher_forced_logprobs(model, prompts, completions, pad)
        start = time.perf_counter()
        for _ in range(5):
            batched_teacher_forced_logprobs(model, prompts, completions, pad)
        forward_s = (time.perf_counter() - start) / 5

    # Alternating rewards give every sample a non-zero advantage, so the step does its full work (none is skipped).
    signal = [float(i % 2) for i in range(len(rollouts))]
    step_s = []
    for step in range(steps):
        batch = TrainBatch(step, rollouts, signal, init.adapter, init.optimizer_state, new_version=1)
        start = time.perf_counter()
        await trainer.train_step(batch)
        step_s.append(time.perf_counter() - start)
    sampler_tps = sampled_tokens / sample_s
    forward_tps = sampled_tokens / forward_s
    return {
        "sampler_tokens_per_s": sampler_tps,
        "teacher_forced_tokens_per_s": forward_tps,
        "sampler_over_teacher_forced": sampler_tps / forward_tps,
        "train_step_s": min(step_s),
        "train_step_samples": len(rollouts),
    }


def cpu_stack_bench(groups: int = 8, group_size: int = 8, max_tokens: int = 8, steps: int = 3) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="rl-bench-") as tmp:
        return asyncio.run(_measure(Path(tmp), groups, group_size, max_tokens, steps))
