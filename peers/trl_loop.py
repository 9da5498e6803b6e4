"""TRL's side of `nox -s bench-peers`: `trl.GRPOTrainer` (`trl==1.16.0`) trained on exactly the demo's setting.

`python -m peers.trl_loop --shape demo --iterations 40 --seed 0` trains in its own process and prints one `RunRecord`
JSON line. Only in the environment `nox -s bench-peers` builds: TRL is never an import of `rl`.

The setting, matched to `rl demo grpo` (rl/local.py `DEMO_MODEL`, `DEMO_TRAINER`; rl/loop/grpo.py):

- model: the demo's tiny base model, built by `rl.local.base_model(root, DEMO_MODEL)` (the same `model.safetensors`)
  and loaded as our trainer loads it (`rl.models.tiny.load_base_model`: float32, eager attention), its tokenizer by
  `load_tokenizer` (`PreTrainedTokenizerFast`; a plain-text prompt gets `<bos>` prepended, as our sampler encodes it)
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

from peers.bench_shapes import SHAPES, IterationClock, RunRecord, bench_prompts, peak_rss_mib, runner_args
from rl.local import DEMO_MODEL, DEMO_TRAINER, base_model
from rl.models.tiny import load_base_model, load_tokenizer
from rl.rewards import is_correct, score


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
        completions: list[str], answer: list[str], completion_ids: list[list[int]], **_: Any
    ) -> list[float]:
        right = sum(is_correct(c, a) for c, a in zip(completions, answer, strict=True))
        scored.append((sum(len(ids) for ids in completion_ids), right / len(completions)))
        return [score(c, a) for c, a in zip(completions, answer, strict=True)]

    return digit_reward


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
    torch.set_num_threads(DEMO_TRAINER.threads)
    model_dir = base_model(root, DEMO_MODEL)
    prompts = bench_prompts(shape.prompts)
    args = GRPOConfig(
        output_dir=str(root / "out"),
        per_device_train_batch_size=shape.prompts * shape.samples,
        num_generations=shape.samples,
        max_completion_length=shape.max_tokens,
        max_steps=iterations,
        learning_rate=DEMO_TRAINER.lr,
        lr_scheduler_type="constant",
        weight_decay=DEMO_TRAINER.weight_decay,
        max_grad_norm=DEMO_TRAINER.max_grad_norm,
        beta=DEMO_TRAINER.kl_beta,
        epsilon=DEMO_TRAINER.clip_eps,
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
        r=DEMO_TRAINER.lora_rank,
        lora_alpha=DEMO_TRAINER.lora_alpha,
        lora_dropout=DEMO_TRAINER.lora_dropout,
        target_modules="all-linear",
        task_type="CAUSAL_LM",
    )
    clock = IterationClock()
    record = RunRecord(impl="trl", shape=shape_name, seed=seed, version=f"trl-{trl.__version__}")
    scored: list[tuple[int, float]] = []
    trainer = GRPOTrainer(
        model=load_base_model(model_dir),
        reward_funcs=[_reward(scored)],
        args=args,
        train_dataset=Dataset.from_dict(
            {"prompt": [p.question for p in prompts], "answer": [p.answer for p in prompts]}
        ),
        processing_class=load_tokenizer(model_dir),
        peft_config=peft_config,
        callbacks=[_StepClock(clock, record, scored)],
    )
    _timed_generation(trainer, clock)
    trainer.train()
    record.peak_rss_mib = peak_rss_mib()
    return record


def main(argv: list[str] | None = None) -> int:
    args = runner_args(argv, "python -m peers.trl_loop")
    with tempfile.TemporaryDirectory(prefix="bench-trl-") as tmp:
        record = run(Path(tmp), args.shape, args.iterations, args.seed)
    print(record.to_json(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
