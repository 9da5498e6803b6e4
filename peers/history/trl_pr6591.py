"""TRL PR #6591 (https://github.com/huggingface/trl/pull/6591), bound for the KL reference law.

The bug (trl <= 1.9.2): handed a model already wrapped in a LoRA adapter (a pretrained adapter, as a run resumed from
SFT is), `GRPOTrainer` copies that adapter under the name "ref" and takes the KL penalty's reference log-probs from it,
except when the adapter uses `target_parameters` (fused MoE experts, or any parameter named directly): then it skips
the copy, only warns, and computes the reference with the adapters disabled, i.e. from the base model, so the penalty
pulls the fine-tuned policy back to the base from the first step. PEFT 0.20.0 allows a second adapter on the same
`target_parameters` (peft#3350); trl 1.10.0 creates the "ref" copy whenever PEFT is that recent. Both sides install
`peft==0.20.0`, so the one thing that differs is TRL's guard.

Bound here, TRL's own code runs every step; the glue only moves adapters and optimizer state in and out:
- engine (`TrlEngine`): TRL's `_tokenize_prompts` and `_generate_single_turn` (transformers' `generate` with TRL's
  generation config), on one `GRPOTrainer` (KL off) whose adapter is loaded from the request's; the rollouts record
  TRL's teacher-forced `_get_per_token_logps_and_entropies` (its transformers path records none while sampling).
- trainer (`TrlTrainer`): each instance builds its `GRPOTrainer` on its first `train_step`, from the model wrapped in
  the adapter that step starts from (`get_peft_model`, then the adapter's weights), as a user hands TRL a pretrained
  PEFT model; `beta=0.04` (TRL's KL penalty on). Each step is TRL's `training_step` (its `_prepare_inputs`,
  `_generate_and_score_completions` with the public `rollout_func` hook handing it the batch's rollouts and a reward
  function the batch's rewards, and `compute_loss` with backward), then `clip_grad_norm_`, `optimizer.step()`. TRL's
  loop computes the old policy's log-probs itself, with the model that sampled; our `Trainer` is handed them with the
  batch (the engine's records), so the glue puts the batch's into `old_per_token_logps` of TRL's generation output,
  where TRL's own loop puts its. `metrics.kl` is TRL's logged `kl` of the step.

The adapter: LoRA r4 on `target_parameters=["q_proj.weight", "v_proj.weight"]` of the tiny model (PEFT's parameter
LoRA, the path the bug is on), no `target_modules`. Declared: TRL's loss choices (`peers.trl_grpo.ALGORITHM`) with its
k3 KL (`use_bias_correction_kl=False`, said explicitly: 1.9.2's default, not 1.10.0's) and
`kl_reference="initial_adapter"` (the "ref" copy).
"""

from __future__ import annotations

import atexit
import functools
import io
import os
import shutil
import tempfile
from dataclasses import replace
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # `rollout_func` warns that it is experimental

import torch
import trl
from datasets import Dataset
from peft import LoraConfig, PeftModel, get_peft_model, get_peft_model_state_dict, set_peft_model_state_dict
from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors
from trl import GRPOConfig, GRPOTrainer

from peers.trl_grpo import ALGORITHM
from rl.conformance import Implementation
from rl.conformance.support.tiny_model import tiny_base_model
from rl.models.opened_model import open_model
from rl.models.tiny import load_base_model, load_tokenizer
from rl.protocols import Artifacts
from rl.types import Rollout, RolloutRequest, StepMetrics, TrainBatch, TrainResult

__all__ = ["ALGORITHM_REF", "IMPL", "TrlEngine", "TrlTrainer"]

BETA = 0.04
ROWS = 8
GROUP = 4
WEIGHTS = "adapter_model.safetensors"
_FRESH = b"fresh AdamW"


def _lora() -> LoraConfig:
    """LoRA on parameters named directly (`target_parameters`), not on modules: the path TRL <= 1.9.2 falls back on."""
    return LoraConfig(
        r=4, lora_alpha=8, lora_dropout=0.0, target_modules=[], target_parameters=["q_proj.weight", "v_proj.weight"]
    )


def _wrapped(files: dict[str, bytes] | None) -> PeftModel:
    """The tiny model wrapped in the adapter: `files`' weights, or PEFT's fresh init (B = 0) when None."""
    model = get_peft_model(load_base_model(open_model(tiny_base_model())), _lora())
    if files is not None:
        set_peft_model_state_dict(model, load_safetensors(files[WEIGHTS]), adapter_name="default")
    return model


def _adapter_files(model: PeftModel) -> dict[str, bytes]:
    weights = get_peft_model_state_dict(model, adapter_name="default")
    return {WEIGHTS: save_safetensors({k: v.detach().clone().contiguous() for k, v in weights.items()})}


_BATCH: list[Rollout] = []
"""The rollouts `rollout_func` hands TRL for the step running now (set by `TrlTrainer.train_step`)."""


def _rollout(prompts: list[Any], trainer: GRPOTrainer) -> dict[str, list[list[Any]]]:
    assert len(_BATCH) == len(prompts), (len(_BATCH), len(prompts))
    return {
        "prompt_ids": [list(r.prompt_token_ids) for r in _BATCH],
        "completion_ids": [list(r.token_ids) for r in _BATCH],
        "logprobs": [list(r.logprobs) for r in _BATCH],
    }


def _reward_column(completions: list[Any], reward: list[float], **_: Any) -> list[float]:
    return list(reward)


def _grpo(model: PeftModel, beta: float) -> GRPOTrainer:
    """A `GRPOTrainer` on `model` (TRL's defaults but the shape, a visible learning rate and `beta`)."""
    torch.set_num_threads(1)
    root = tempfile.mkdtemp(prefix="peers-trl-6591-")
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    args = GRPOConfig(
        output_dir=os.path.join(root, "out"),
        per_device_train_batch_size=ROWS,
        num_generations=GROUP,
        max_completion_length=4,
        learning_rate=1e-2,
        beta=beta,
        use_bias_correction_kl=False,  # k3 on both sides (1.10.0 changed the default to True)
        top_k=0,
        bf16=False,
        gradient_checkpointing=False,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[_reward_column],
        args=args,
        train_dataset=Dataset.from_dict({"prompt": ["3="] * ROWS, "reward": [0.0] * ROWS}),
        processing_class=load_tokenizer(open_model(tiny_base_model())),
        rollout_func=_rollout,
    )
    trainer.current_gradient_accumulation_steps = 1
    return trainer


@functools.cache
def _sampler() -> GRPOTrainer:
    return _grpo(_wrapped(None), beta=0.0)


def _teacher_forced(tr: GRPOTrainer, prompt_ids: list[list[int]], completion_ids: list[list[int]]) -> list[list[float]]:
    """TRL's `_get_per_token_logps_and_entropies` on the batch (prompts of one length: the law's digit prompts)."""
    pad_id = tr.processing_class.pad_token_id
    width = max(1, max(len(c) for c in completion_ids))
    completions = torch.full((len(completion_ids), width), pad_id, dtype=torch.long)
    completion_mask = torch.zeros_like(completions)
    for i, c in enumerate(completion_ids):
        completions[i, : len(c)] = torch.tensor(c, dtype=torch.long)
        completion_mask[i, : len(c)] = 1
    prompts = torch.tensor(prompt_ids, dtype=torch.long)
    ids = torch.cat([prompts, completions], dim=1)
    mask = torch.cat([torch.ones_like(prompts), completion_mask], dim=1)
    with torch.no_grad():
        logps, _ = tr._get_per_token_logps_and_entropies(tr.model, ids, mask, width, batch_size=len(ids))[:2]
    return [logps[i, : len(c)].tolist() for i, c in enumerate(completion_ids)]


class TrlEngine:
    """A `RolloutEngine` sampling with TRL's own transformers generation (module docstring)."""

    def __init__(self, artifacts: Artifacts) -> None:
        self.artifacts = artifacts

    @property
    def eos_token_id(self) -> int | None:
        return int(_sampler().processing_class.eos_token_id)

    async def generate(self, request: RolloutRequest) -> list[Rollout]:
        tr = _sampler()
        files = await self.artifacts.get(request.adapter)
        set_peft_model_state_dict(tr.model, load_safetensors(files[WEIGHTS]), adapter_name="default")
        tr.model.eval()
        tr.generation_config.max_new_tokens = request.max_tokens
        torch.manual_seed(request.seed)
        prompt_ids = tr._tokenize_prompts([request.prompt.question] * request.n)[0]
        completion_ids = tr._generate_single_turn(prompt_ids, None, {})[0]
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


class TrlTrainer:
    """A `Trainer` running TRL's own training step, its `GRPOTrainer` built from the adapter it starts from."""

    def __init__(self, artifacts: Artifacts) -> None:
        self.artifacts = artifacts
        self.trainer: GRPOTrainer | None = None

    async def init_adapter(self, seed: int) -> TrainResult:
        torch.manual_seed(seed)
        adapter = await self.artifacts.put(_adapter_files(_wrapped(None)), name="trl-adapter")
        optimizer = await self.artifacts.put({"optimizer.pt": _FRESH}, name="trl-optimizer")
        return TrainResult(adapter, optimizer, 0, StepMetrics(loss=0.0, contributing=0, skipped_zero_advantage=0))

    async def train_step(self, batch: TrainBatch) -> TrainResult:
        files = await self.artifacts.get(batch.adapter)
        if self.trainer is None:  # the run starts here: TRL is handed the model wrapped in this adapter
            self.trainer = _grpo(_wrapped(files), beta=BETA)
        tr = self.trainer
        set_peft_model_state_dict(tr.model, load_safetensors(files[WEIGHTS]), adapter_name="default")
        tr.optimizer = None
        optimizer = tr.create_optimizer()
        saved = (await self.artifacts.get(batch.optimizer_state))["optimizer.pt"] if batch.optimizer_state else _FRESH
        if saved != _FRESH:
            optimizer.load_state_dict(torch.load(io.BytesIO(saved), weights_only=True))
        tr.num_generations = len(batch.rollouts) // len({r.group_id for r in batch.rollouts})
        _BATCH[:] = batch.rollouts
        rows = [{"prompt": r.question, "reward": w} for r, w in zip(batch.rollouts, batch.rewards, strict=True)]
        generate = tr._generate_and_score_completions

        def with_recorded_old(inputs: Any) -> dict[str, Any]:
            output = generate(inputs)
            old = torch.zeros_like(output["completion_mask"], dtype=torch.float32)
            for i, r in enumerate(batch.rollouts):
                old[i, : len(r.logprobs)] = torch.tensor(r.logprobs, dtype=torch.float32)
            output["old_per_token_logps"] = old  # the sampling policy's, as TRL's loop records its own
            return output

        tr._generate_and_score_completions = with_recorded_old
        tr._step, tr._buffered_inputs = 0, None
        torch.manual_seed(batch.step)  # `_prepare_inputs` shuffles with the global generator (peers.trl_whole)
        tr.model.train()
        try:
            loss = tr.training_step(tr.model, rows, None)
        finally:
            del tr._generate_and_score_completions
        grad_norm = torch.nn.utils.clip_grad_norm_(
            [p for p in tr.model.parameters() if p.requires_grad], tr.args.max_grad_norm
        )
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        state = io.BytesIO()
        torch.save(optimizer.state_dict(), state)
        adapter = await self.artifacts.put(_adapter_files(tr.model), name="trl-adapter")
        opt_ref = await self.artifacts.put({"optimizer.pt": state.getvalue()}, name="trl-optimizer")
        metrics = StepMetrics(
            loss=float(loss),
            contributing=len(rows),
            skipped_zero_advantage=0,
            kl=float(tr._metrics["train"]["kl"][-1]),
            grad_norm=float(grad_norm),
        )
        return TrainResult(adapter, opt_ref, batch.new_version, metrics)


ALGORITHM_REF = replace(ALGORITHM, kl_estimator="k3", kl_reference="initial_adapter")
"""TRL's choices with its KL penalty on (k3, no bias correction) against the copied "ref" adapter."""

IMPL = Implementation(
    name=f"trl-{trl.__version__}-pretrained-adapter", engine=TrlEngine, trainer=TrlTrainer, algorithm=ALGORITHM_REF
)
