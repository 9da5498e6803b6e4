"""TRL's whole GRPO step (`trl==1.16.0`) under the engine and trainer laws: `--rl-impl peers.trl_whole:IMPL_WHOLE`
(`-m "rl_engine or rl_trainer"`; `nox -s "peers(peer='trl_whole')"`).

A real `GRPOTrainer`, built once per process and sampling setting on our tiny offline model
(`rl.conformance.support.tiny_model.tiny_base_model`, the model `REAL_CPU` binds) with a LoRA adapter (r4, alpha 8,
PEFT's `peft_config`), float32, CPU, one thread, and otherwise TRL's default `GRPOConfig` but for the shape (groups of
4, 8 rows a step: the trainer laws' batch), `learning_rate` 1e-2 (TRL's 1e-6 moves a tiny model's log-probs by less than
the laws can see) and the sampling settings: GRPOConfig's `temperature`, `top_p` and `top_k` are those of the request or
batch (`sampling`; the defaults 1.0, 1.0 and 0: no cut), one trainer per distinct setting, as a run configures TRL once
with its own. Adapters travel as PEFT's files (`adapter_config.json`, `adapter_model.safetensors`); the optimizer state
as `torch.save` of AdamW's `state_dict`. The glue loads them into the trainer's model before each call; everything else
is TRL's own code:

- engine (`TrlEngine`): `trainer._tokenize_prompts` and `trainer._generate_single_turn` (transformers' `generate`
  with TRL's `generation_config`, and TRL's own cut at the first `<eos>`), `n` copies of the prompt in one batch as
  TRL's sampler lays a group out; the global torch generator seeded with the request's seed first (TRL seeds it once
  per run, `set_seed(args.seed)`). TRL's `generation_config` samples from softmax(logits / T) cut to top-k then
  top-p and renormalised (transformers' warpers). TRL records no log-probs on this path (`logprobs = None`): the
  recorded ones are TRL's teacher-forced `_get_per_token_logps_and_entropies`, what it uses as the old policy's when it
  needs one: log softmax(logits / T) over the whole vocabulary (its fused LM head divides by `args.temperature` and
  applies no cut).
- trainer (`TrlTrainer`): `trainer.training_step` on the batch's rows, which runs TRL's `_prepare_inputs` and
  `_generate_and_score_completions` (the public `rollout_func` hook hands it the batch's rollouts instead of
  generating, a reward function the batch's rewards) and its `compute_loss` and backward; then what `Trainer`'s inner
  loop does after it: `clip_grad_norm_` at `max_grad_norm`, `optimizer.step()`, `zero_grad()`. The global generator
  (which `_prepare_inputs` shuffles the batch with) is seeded with the batch's step, since the artifacts carry no
  generator state (TRL's checkpoint does: `rng_state.pth`). No staleness check
  exists in TRL (its loop has no policy versions), so none is added.

Declared (`ALGORITHM_WHOLE`): TRL's advantage and loss choices (`peers.trl_grpo.ALGORITHM`) and
`importance_ratio="on_policy"`: with one generation per step (`num_iterations=1`, `steps_per_generation` =
gradient accumulation, no vLLM) `_generate_and_score_completions` sets `old_per_token_logps = None` and `_compute_loss`
uses `per_token_logps.detach()`, so the ratio is 1 whatever the engine recorded; and
`logprob_truncation="ignored"`: TRL's log-probs (recorded and trained alike) are of the tempered distribution before
the top-k/top-p cut, which decides only what is drawn.
"""

from __future__ import annotations

import atexit
import functools
import io
import json
import os
import shutil
import tempfile
from dataclasses import replace
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # `rollout_func` warns that it is experimental

import torch
from datasets import Dataset
from peft import LoraConfig, get_peft_model_state_dict, set_peft_model_state_dict
from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors
from trl import GRPOConfig, GRPOTrainer
from trl.trainer.utils import pad

from peers.trl_grpo import ALGORITHM
from peers.trl_trainer import VERSION
from rl.conformance import Implementation
from rl.conformance.support.tiny_model import tiny_base_model
from rl.models.opened_model import open_model
from rl.models.tiny import load_base_model, load_tokenizer
from rl.protocols import Artifacts
from rl.types import DEFAULT_SAMPLING, Rollout, RolloutRequest, SamplingSettings, StepMetrics, TrainBatch, TrainResult

__all__ = ["ALGORITHM_WHOLE", "IMPL_WHOLE", "TrlEngine", "TrlTrainer"]

GROUP = 4
ROWS = 8
_FRESH = b"fresh AdamW"


_BATCH: list[Rollout] = []
"""The rollouts `rollout_func` hands TRL for the step running now (set by `TrlTrainer.train_step`)."""


def _rollout(prompts: list[Any], trainer: GRPOTrainer) -> dict[str, list[list[Any]]]:
    rows = _BATCH
    assert len(rows) == len(prompts), (len(rows), len(prompts))
    return {
        "prompt_ids": [list(r.prompt_token_ids) for r in rows],
        "completion_ids": [list(r.token_ids) for r in rows],
        "logprobs": [list(r.logprobs) for r in rows],
    }


def _reward_column(completions: list[Any], reward: list[float], **_: Any) -> list[float]:
    return list(reward)


@functools.cache
def whole_trainer(sampling: SamplingSettings = DEFAULT_SAMPLING) -> GRPOTrainer:
    """The one `GRPOTrainer` configured with `sampling` (GRPOConfig's temperature, top_p, top_k) in this process."""
    torch.set_num_threads(1)
    root = tempfile.mkdtemp(prefix="peers-trl-whole-")
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    base = open_model(tiny_base_model())
    args = GRPOConfig(
        output_dir=os.path.join(root, "out"),
        per_device_train_batch_size=ROWS,
        num_generations=GROUP,
        max_completion_length=4,
        learning_rate=1e-2,
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        top_k=sampling.top_k,
        bf16=False,
        gradient_checkpointing=False,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
    )
    trainer = GRPOTrainer(
        model=load_base_model(base),
        reward_funcs=[_reward_column],
        args=args,
        train_dataset=Dataset.from_dict({"prompt": ["3="] * ROWS, "reward": [0.0] * ROWS}),
        processing_class=load_tokenizer(base),
        peft_config=LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules="all-linear"),
        rollout_func=_rollout,
    )
    trainer.current_gradient_accumulation_steps = 1
    return trainer


def _load_adapter(tr: GRPOTrainer, files: dict[str, bytes]) -> None:
    set_peft_model_state_dict(tr.model, load_safetensors(files["adapter_model.safetensors"]))


def _adapter_files(tr: GRPOTrainer) -> dict[str, bytes]:
    model = tr.model
    weights = {k: v.detach().clone().contiguous() for k, v in get_peft_model_state_dict(model).items()}
    config = model.peft_config["default"].to_dict()
    config = {k: sorted(v) if isinstance(v, set) else v for k, v in config.items()}
    return {
        "adapter_config.json": json.dumps(config, sort_keys=True, default=str).encode(),
        "adapter_model.safetensors": save_safetensors(weights),
    }


class TrlEngine:
    """A `RolloutEngine` sampling with TRL's own transformers generation (module docstring)."""

    def __init__(self, artifacts: Artifacts) -> None:
        self.artifacts = artifacts

    @property
    def eos_token_id(self) -> int | None:
        return int(whole_trainer().eos_token_ids[0])

    async def generate(self, request: RolloutRequest) -> list[Rollout]:
        tr = whole_trainer(request.sampling)
        _load_adapter(tr, await self.artifacts.get(request.adapter))
        tr.model.eval()
        tr.generation_config.max_new_tokens = request.max_tokens
        torch.manual_seed(request.seed)
        prompt_ids, _, _ = tr._tokenize_prompts([request.prompt.question] * request.n)
        completion_ids, _ = tr._generate_single_turn(prompt_ids, None, {}, request.n)
        logprobs = _teacher_forced(tr, prompt_ids, completion_ids)
        texts = tr.processing_class.batch_decode(completion_ids, skip_special_tokens=True)
        return [
            Rollout(
                group_id=request.group_id,
                question=request.prompt.question,
                answer=request.prompt.answer,
                completion=text,
                prompt_token_ids=list(p),
                token_ids=list(c),
                logprobs=lp,
                policy_version=request.policy_version,
                seed=request.seed,
            )
            for p, c, lp, text in zip(prompt_ids, completion_ids, logprobs, texts, strict=True)
        ]


def _teacher_forced(tr: GRPOTrainer, prompt_ids: list[list[int]], completion_ids: list[list[int]]) -> list[list[float]]:
    """TRL's `_get_per_token_logps_and_entropies` on the padded batch, as `_generate_and_score_completions` pads it."""
    pad_id = tr._tokenizer.pad_token_id
    prompts = pad([torch.tensor(p) for p in prompt_ids], padding_value=pad_id, padding_side="left")
    prompt_mask = pad([torch.ones(len(p), dtype=torch.long) for p in prompt_ids], padding_value=0, padding_side="left")
    width = max(1, max(len(c) for c in completion_ids))
    completions = torch.full((len(completion_ids), width), pad_id, dtype=torch.long)
    completion_mask = torch.zeros_like(completions)
    for i, c in enumerate(completion_ids):
        completions[i, : len(c)] = torch.tensor(c, dtype=torch.long)
        completion_mask[i, : len(c)] = 1
    ids = torch.cat([prompts, completions], dim=1)
    mask = torch.cat([prompt_mask, completion_mask], dim=1)
    with torch.no_grad():
        logps, _, _ = tr._get_per_token_logps_and_entropies(tr.model, ids, mask, width, batch_size=len(ids))
    return [logps[i, : len(c)].tolist() for i, c in enumerate(completion_ids)]


class TrlTrainer:
    """A `Trainer` running TRL's own training step (module docstring)."""

    def __init__(self, artifacts: Artifacts) -> None:
        self.artifacts = artifacts

    async def init_adapter(self, seed: int) -> TrainResult:
        tr = whole_trainer()
        torch.manual_seed(seed)
        for module in tr.model.modules():
            if hasattr(module, "reset_lora_parameters") and "default" in getattr(module, "lora_A", {}):
                module.reset_lora_parameters("default", True)
        adapter = await self.artifacts.put(_adapter_files(tr), name="trl-adapter")
        optimizer = await self.artifacts.put({"optimizer.pt": _FRESH}, name="trl-optimizer")
        return TrainResult(adapter, optimizer, 0, StepMetrics(loss=0.0, contributing=0, skipped_zero_advantage=0))

    async def train_step(self, batch: TrainBatch) -> TrainResult:
        tr = whole_trainer(batch.sampling)
        _load_adapter(tr, await self.artifacts.get(batch.adapter))
        tr.optimizer = None
        optimizer = tr.create_optimizer()
        saved = (await self.artifacts.get(batch.optimizer_state))["optimizer.pt"] if batch.optimizer_state else _FRESH
        if saved != _FRESH:
            optimizer.load_state_dict(torch.load(io.BytesIO(saved), weights_only=True))
        groups = {r.group_id for r in batch.rollouts}
        tr.num_generations = len(batch.rollouts) // len(groups)
        _BATCH[:] = batch.rollouts
        rows = [{"prompt": r.question, "reward": w} for r, w in zip(batch.rollouts, batch.rewards, strict=True)]
        tr._step, tr._buffered_inputs = 0, None
        # `_prepare_inputs` shuffles the generation batch with the global generator, which TRL's own loop seeds once and
        # restores from its checkpoint (rng_state.pth); our artifacts carry no generator, so the step number seeds it.
        torch.manual_seed(batch.step)
        tr.model.train()
        loss = tr.training_step(tr.model, rows, None)
        grad_norm = torch.nn.utils.clip_grad_norm_(
            [p for p in tr.model.parameters() if p.requires_grad], tr.args.max_grad_norm
        )
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        state = io.BytesIO()
        torch.save(optimizer.state_dict(), state)
        adapter = await self.artifacts.put(_adapter_files(tr), name="trl-adapter")
        opt_ref = await self.artifacts.put({"optimizer.pt": state.getvalue()}, name="trl-optimizer")
        metrics = StepMetrics(
            loss=float(loss), contributing=len(rows), skipped_zero_advantage=0, grad_norm=float(grad_norm)
        )
        return TrainResult(adapter, opt_ref, batch.new_version, metrics)


ALGORITHM_WHOLE = replace(ALGORITHM, importance_ratio="on_policy", logprob_truncation="ignored")
"""TRL 1.16.0's default choices, on-policy (one generation per step, so its ratio is 1), its log-probs tempered but not
cut (module docstring)."""

IMPL_WHOLE = Implementation(
    name=f"trl-{VERSION}-whole", engine=TrlEngine, trainer=TrlTrainer, algorithm=ALGORITHM_WHOLE
)
