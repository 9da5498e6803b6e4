"""TRL's side of `nox -s bench-peers`: `trl.GRPOTrainer` (`trl==1.16.0`) trained on exactly the demo's setting.

`python -m peers.trl_loop --shape demo --iterations 40 --seed 0` trains in its own process and prints one `RunRecord`
JSON line. Only in the environment `nox -s bench-peers` builds: TRL is never an import of `rl`.

The setting, matched to `rl demo grpo` (rl/deploy/local.py `DEMO_MODEL`, `DEMO_TRAINER`; rl/loop/grpo.py):

- model: the demo's tiny base model, built by `rl.deploy.local.base_model(root, DEMO_MODEL)` (the same
  `model.safetensors`) and loaded as our trainer loads it (`rl.models.tiny.load_base_model`: float32, eager attention),
  its tokenizer by `load_tokenizer` (`PreTrainedTokenizerFast`; a plain-text prompt gets `<bos>` prepended, as our
  sampler encodes it)
- prompts: `DigitSuccessor`'s, through `peers.bench_shapes.bench_prompts` (the large shape's 32 per step are drawn
  from the ten repeated four times, as on our side); TRL's `RepeatSampler` draws `prompts` of them per step
- reward: `rl.rewards.score(completion, answer)`, what `RewardScorer("default")` applies; TRL decodes completions
  with special tokens skipped, as our sampler does
- shape: `per_device_train_batch_size = prompts x samples`, `num_generations = samples`, one generation and one
  optimizer step per iteration (`steps_per_generation` = gradient accumulation = 1), `max_completion_length`
- LoRA r8, alpha 16, dropout 0 on all linear layers (`peft_config`); AdamW lr 1e-2 at a constant schedule (ours has
  no schedule), gradient norm clipped at 1.0 (TRL's default and ours), beta (KL) 0.03, epsilon 0.2, `scale_rewards=
  "group"`, temperature 1.0, top-p 1.0, no top-k
- float32 (`bf16=False`: TRL's default would be bfloat16) and no gradient checkpointing (TRL's default is on; our
  trainer does not checkpoint), no vLLM, no evaluation, no saving, one torch thread; everything else TRL's default
  (its loss is `loss_type="dapo"`)

Per-iteration wall and CPU seconds are marked by a `TrainerCallback` at each step's end (the first from the start of
training); generation CPU by timing `trainer._generate` (TRL's generation and decoding); tokens and accuracy by the
reward function, which sees every completion's ids and text once per step.

A real-model shape (`--shape smollm2`) is `rl demo grpo --model smollm2`'s setting instead: the pinned model's
directory (`rl.models.pretrained.resolve_model`, loaded by the same functions), `Addition`'s training prompts as
conversations (TRL applies the chat template with the assistant's turn opened, as `rl.models.chat.encode_prompt` does;
completions come back as messages, the reward scores their text), `REAL_MODEL_TRAINER`'s LoRA (r8, alpha 16 on
q/k/v/o), lr, beta and threads (2); TRL stops at the tokenizer's eos, `<|im_end|>`, as ours does. After training, the
trained `PeftModel` is evaluated by `rl.bench.heldout.heldout_accuracy`, as bench_ours evaluates ours; neither
evaluation is in the iteration times.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
import trl
from datasets import Dataset
from peft import LoraConfig
from transformers import TrainerCallback
from trl import GRPOConfig, GRPOTrainer

from peers.bench_shapes import (
    HELDOUT_SAMPLES,
    SHAPES,
    IterationClock,
    RunRecord,
    Shape,
    bench_prompts,
    peak_rss_mib,
    runner_args,
)
from rl.bench.heldout import heldout_accuracy
from rl.deploy.local import DEMO_MODEL, DEMO_TRAINER, REAL_MODEL_TRAINER, base_model, demo_problems
from rl.models.opened_model import ModelDir
from rl.models.pretrained import resolve_model
from rl.models.tiny import load_base_model, load_tokenizer
from rl.rewards import is_correct, score
from rl.trainer.config import TrainerConfig


class _StepClock(TrainerCallback):
    """Closes one iteration on `clock` at every optimizer step's end; the first iteration starts with training."""

    def __init__(self, clock: IterationClock, record: RunRecord, scored: list[tuple[int, float]]) -> None:
        self.clock, self.record, self.scored = clock, record, scored

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.clock.mark()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        wall, cpu, gen_cpu = self.clock.mark()
        tokens, accuracy = self.scored.pop() if self.scored else (0, float("nan"))
        self.record.wall_s.append(wall)
        self.record.cpu_s.append(cpu)
        self.record.gen_cpu_s.append(gen_cpu)
        self.record.gen_tokens.append(tokens)
        self.record.accuracy.append(accuracy)


def _reward(scored: list[tuple[int, float]]) -> Any:
    """A TRL reward function: `rl.rewards.score` per completion; notes the step's generated tokens and accuracy."""

    def digit_reward(
        completions: list[Any], answer: list[str], completion_ids: list[list[int]], **_: Any
    ) -> list[float]:
        texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]  # conversational: messages
        right = sum(is_correct(c, a) for c, a in zip(texts, answer, strict=True))
        scored.append((sum(len(ids) for ids in completion_ids), right / len(texts)))
        return [score(c, a) for c, a in zip(texts, answer, strict=True)]

    return digit_reward


def _task(root: Path, shape: Shape) -> tuple[ModelDir, TrainerConfig, Dataset]:
    """The opened model directory, our trainer's settings and TRL's training dataset, as `rl demo grpo` trains the
    shape: the tiny model on the digit task, or (`shape.model`) the real model on `Addition` with `--model`'s
    trainer."""
    if shape.model is None:
        prompts = bench_prompts(shape.prompts)
        questions: list[Any] = [p.question for p in prompts]
        return base_model(root, DEMO_MODEL), DEMO_TRAINER, _dataset(questions, [p.answer for p in prompts])
    real = list(demo_problems(real_model=True).train_prompts())
    # Conversational: TRL applies the chat template with the assistant's turn opened, as rl.models.chat does.
    chats = [[{"role": "user", "content": p.question}] for p in real]
    return resolve_model(shape.model), REAL_MODEL_TRAINER, _dataset(chats, [p.answer for p in real])


def _dataset(prompts: list[Any], answers: list[str]) -> Dataset:
    return Dataset.from_dict({"prompt": prompts, "answer": answers})


def _timed_generation(trainer: GRPOTrainer, clock: IterationClock) -> None:
    generate = trainer._generate

    def timed(*args: Any, **kwargs: Any) -> Any:
        clock.generation_started()
        try:
            return generate(*args, **kwargs)
        finally:
            clock.generation_ended()

    trainer._generate = timed


def run(root: Path, shape_name: str, iterations: int, seed: int) -> RunRecord:
    shape = SHAPES[shape_name]
    model_dir, ours, dataset = _task(root, shape)
    torch.set_num_threads(ours.threads)
    args = GRPOConfig(
        output_dir=str(root / "out"),
        per_device_train_batch_size=shape.prompts * shape.samples,
        num_generations=shape.samples,
        max_completion_length=shape.max_tokens,
        max_steps=iterations,
        learning_rate=ours.lr,
        lr_scheduler_type="constant",
        weight_decay=ours.weight_decay,
        max_grad_norm=ours.max_grad_norm,
        beta=ours.kl_beta,
        epsilon=ours.clip_eps,
        scale_rewards="group",
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        use_vllm=False,
        bf16=False,
        gradient_checkpointing=False,
        eval_strategy="no",
        save_strategy="no",
        report_to=[],
        disable_tqdm=True,
        use_cpu=True,
        seed=seed,
        dataloader_num_workers=0,
    )
    peft_config = LoraConfig(
        r=ours.lora_rank,
        lora_alpha=ours.lora_alpha,
        lora_dropout=ours.lora_dropout,
        target_modules=ours.target_modules if isinstance(ours.target_modules, str) else list(ours.target_modules),
        task_type="CAUSAL_LM",
    )
    clock = IterationClock()
    record = RunRecord(impl="trl", shape=shape_name, seed=seed, version=f"trl-{trl.__version__}")
    scored: list[tuple[int, float]] = []
    tokenizer = load_tokenizer(model_dir)
    trainer = GRPOTrainer(
        model=load_base_model(model_dir),
        reward_funcs=[_reward(scored)],
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=peft_config,
        callbacks=[_StepClock(clock, record, scored)],
    )
    _timed_generation(trainer, clock)
    trainer.train()
    record.peak_rss_mib = peak_rss_mib()
    if shape.model is not None:  # the trained policy, evaluated as ours is (bench_ours)
        trainer.model.eval()
        record.heldout_correct, record.heldout_total = heldout_accuracy(trainer.model, tokenizer, HELDOUT_SAMPLES)
    return record


def main(argv: list[str] | None = None) -> int:
    args = runner_args(argv, "python -m peers.trl_loop")
    with tempfile.TemporaryDirectory(prefix="bench-trl-") as tmp:
        record = run(Path(tmp), args.shape, args.iterations, args.seed)
    print(record.to_json(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
