"""SmolLM2-135M-Instruct through the CPU stack (`nox -s real-model`): the pinned model loads, the trainer's
teacher-forced log-probs equal what our sampler recorded on the same sampled tokens (float32), and a few GRPO
iterations give finite losses and move the policy. Sized for a CI session of minutes on 2 cores; the learning claim
is a benchmark (docs/benchmarks.md), not a test here."""

from __future__ import annotations

import asyncio
import math
import os
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch

from rl.deploy.local import REAL_MODEL_TRAINER, local_grpo
from rl.loop.grpo import GrpoConfig, run_grpo
from rl.models import load_tokenizer
from rl.models.opened_model import ModelDir, open_model
from rl.models.pretrained import SMOLLM2, pinned_model
from rl.problems import Addition
from rl.samplers.decoding import teacher_forced_logprobs
from rl.storage.run_dir import open_run
from rl.trainer.adapter import load_policy
from rl.types import RolloutRequest

# 4 prompts x 4: a group of the base (about 0.19 right) has no reward spread with p ~0.43, so 8 groups give no gradient
# with p ~0.001 (2 prompts gave none on seed 0 once the sampler drew by inverse CDF).
CONFIG = GrpoConfig(iterations=2, prompts_per_iteration=4, group_size=4, seed=0, max_tokens=10, evaluate=False)

# Float32 rounding between two computations of the same log-probs: the sampler's (LoRA merged into the weights, a
# KV-cached decode of 4 rows) and the trainer's (PEFT's unmerged LoRA, one full forward). Logits reach |40| here; a
# float32 logit carries ~40 * 2**-24 ~ 2.4e-6 of rounding per operation, accumulated over 30 layers: measured mean
# 3.9e-6, max 1.7e-5 over 40 tokens (docs/vllm-cpu.md). A bug (a log-prob one position off, another adapter, the
# base without the adapter) moves them by a tenth of a nat or more: the test checks the bound stands 100x below that.
MEAN_BOUND = 1e-4
MAX_BOUND = 1e-3


@pytest.fixture(scope="module")
def model_dir() -> ModelDir:
    return open_model(pinned_model(SMOLLM2))


@pytest.fixture(scope="module")
def run(model_dir: ModelDir, tmp_path_factory: pytest.TempPathFactory) -> Any:
    with open_run(tmp_path_factory.mktemp("real-run"), command="test") as run_dir:
        deployment = local_grpo(
            run_dir, CONFIG, model_dir=model_dir, trainer=REAL_MODEL_TRAINER, buffer=False, report_interval_s=1e9
        )
        outcome = asyncio.run(run_grpo(CONFIG, deployment.tiers, deployment.store))
    return deployment, outcome


def test_the_pinned_model_is_smollm2_with_its_chat_template_and_end_of_turn(model_dir: ModelDir) -> None:
    config = (model_dir.where / "config.json").read_text()
    assert '"model_type": "llama"' in config and '"num_hidden_layers": 30' in config
    tokenizer = load_tokenizer(model_dir)
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.chat_template


def test_a_few_iterations_give_finite_losses_and_move_the_policy(run: Any) -> None:
    deployment, outcome = run
    assert [row.policy_version for row in outcome.history] == [1, 2]
    assert all(math.isfinite(row.mean_loss) and math.isfinite(row.grad_norm) for row in outcome.history)
    assert any(row.grad_norm > 0 for row in outcome.history)
    first = outcome.history[0].sample_question + outcome.history[0].sample_completion
    print(f"sample completion: {first!r}")  # the report shows these as text too
    v2 = asyncio.run(deployment.tiers.artifacts.get(outcome.adapter))
    policy = load_policy(deployment.base_dir, v2, trainable=False)
    lora_b = [p for name, p in policy.named_parameters() if "lora_B" in name]
    assert lora_b and max(float(p.abs().max()) for p in lora_b) > 0  # version 0 has B = 0: it moved


def test_the_trainers_log_probs_equal_the_samplers_on_the_same_tokens(run: Any) -> None:
    deployment, outcome = run
    prompt = Addition().eval_prompts()[0]
    request = RolloutRequest(
        group_id=0, prompt=prompt, n=4, adapter=outcome.adapter, policy_version=2, seed=7, max_tokens=10
    )
    rollouts = asyncio.run(deployment.tiers.engine.generate(request))
    files = asyncio.run(deployment.tiers.artifacts.get(outcome.adapter))
    policy = load_policy(deployment.base_dir, files, trainable=False)
    deltas, shifted = [], []
    with torch.no_grad():
        for r in rollouts:
            trainer_logp = teacher_forced_logprobs(policy, r.prompt_token_ids, r.token_ids)  # [T], float32
            sampled = torch.tensor(r.logprobs, dtype=torch.float32)  # [T]
            deltas += (trainer_logp - sampled).abs().tolist()
            shifted += (trainer_logp[1:] - sampled[:-1]).abs().tolist()  # what a one-off misalignment would give
            with policy.disable_adapter():
                base_logp = teacher_forced_logprobs(policy, r.prompt_token_ids, r.token_ids)
    mean, worst = sum(deltas) / len(deltas), max(deltas)
    print(f"log-prob |delta| over {len(deltas)} tokens: mean {mean:.3g}, max {worst:.3g}")
    assert mean <= MEAN_BOUND and worst <= MAX_BOUND
    assert sum(shifted) / len(shifted) >= 100 * MEAN_BOUND  # the bound tells a misalignment from rounding
    assert float((base_logp - torch.tensor(rollouts[-1].logprobs)).abs().max()) > MAX_BOUND  # and the adapter matters
