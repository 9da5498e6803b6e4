"""CPU figures for the real stack on the tiny model: sampler tokens/s, its teacher-forced ceiling, train-step seconds.

The sampler decodes one token per forward for a group; a teacher-forced forward scores every token of the same
sequences at once, so its tokens/s is the sampler's ceiling on this machine and the ratio says how far decoding is
from it. Every figure is repeated on the same work (`repeats`, 5 by default) and reported as its median and its
min-max (`_min`, `_max`): a single timed call varied 7x over six runs on a shared 2-core machine (issue 17).
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from rl.bench.figures import check_repeats, spread
from rl.deploy.local import DEMO_MODEL, DEMO_TRAINER, base_model
from rl.loop.grpo import GrpoConfig, GrpoTiers, generate_and_score
from rl.problems import DigitSuccessor
from rl.samplers.decoding import batched_teacher_forced_logprobs
from rl.samplers.torch_sampler import TorchSampler
from rl.scoring import RewardScorer
from rl.storage.artifacts import LocalArtifacts
from rl.trainer.peft_trainer import PeftTrainer
from rl.types import TrainBatch


async def _measure(root: Path, groups: int, group_size: int, max_tokens: int, repeats: int) -> dict[str, Any]:
    base = base_model(root, DEMO_MODEL)
    artifacts = LocalArtifacts(root / "artifacts")
    trainer = PeftTrainer(base, artifacts, DEMO_TRAINER)
    sampler = TorchSampler(base, artifacts, threads=DEMO_TRAINER.threads)
    init = await trainer.init_adapter(0)
    config = GrpoConfig(prompts_per_iteration=groups, group_size=group_size, max_tokens=max_tokens)
    tiers = GrpoTiers(sampler, RewardScorer(), trainer, artifacts, DigitSuccessor())

    await generate_and_score(config, tiers, 0, init.adapter, 0)  # warm: adapter load, first-call overheads
    sample_wall, sample_cpu = [], []
    for _ in range(repeats):  # the same seeded call each time: the same work, so the spread is the machine's
        wall, cpu = time.perf_counter(), time.process_time()
        rollouts = (await generate_and_score(config, tiers, 1, init.adapter, 0)).rollouts
        sample_wall.append(time.perf_counter() - wall)
        sample_cpu.append(time.process_time() - cpu)
    sampled_tokens = sum(len(r.token_ids) for r in rollouts)

    model = await sampler.policy(init.adapter)
    prompts, completions = [r.prompt_token_ids for r in rollouts], [r.token_ids for r in rollouts]
    pad = int(sampler.tokenizer.pad_token_id or 0)
    forward_s = []
    with torch.no_grad():
        batched_teacher_forced_logprobs(model, prompts, completions, pad)
        for _ in range(repeats):
            start = time.perf_counter()
            batched_teacher_forced_logprobs(model, prompts, completions, pad)
            forward_s.append(time.perf_counter() - start)

    # Alternating rewards give every sample a non-zero advantage, so the step does its full work (none is skipped).
    signal = [float(i % 2) for i in range(len(rollouts))]
    step_s = []
    for step in range(repeats):
        batch = TrainBatch(step, rollouts, signal, init.adapter, init.optimizer_state, new_version=1)
        start = time.perf_counter()
        await trainer.train_step(batch)
        step_s.append(time.perf_counter() - start)
    sampler_tps = spread("sampler_tokens_per_s", [sampled_tokens / s for s in sample_wall])
    forward_tps = spread("teacher_forced_tokens_per_s", [sampled_tokens / s for s in forward_s])
    return {
        **sampler_tps,
        **spread("sampler_tokens_per_cpu_s", [sampled_tokens / s for s in sample_cpu]),
        **forward_tps,
        "sampler_over_teacher_forced": sampler_tps["sampler_tokens_per_s"] / forward_tps["teacher_forced_tokens_per_s"],
        **spread("train_step_s", step_s),
        "train_step_samples": len(rollouts),
        "cpu_repeats": repeats,
    }


def cpu_stack_bench(groups: int = 8, group_size: int = 8, max_tokens: int = 8, repeats: int = 5) -> dict[str, Any]:
    """Each figure measured `repeats` times on the same work: its median under its own name, its spread as `_min` and
    `_max`. The sampler's figure is given per wall second and per CPU second (`time.process_time`), the one a loaded
    machine disturbs least."""
    check_repeats(repeats)
    with tempfile.TemporaryDirectory(prefix="rl-bench-") as tmp:
        return asyncio.run(_measure(Path(tmp), groups, group_size, max_tokens, repeats))
