"""The GRPO loop deployed in one process on the CPU: tiny model, torch sampler, PEFT trainer, files on disk.

This is what `rl demo grpo` runs and what the learning test trains; the Flyte tasks bind the same components.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from transformers.utils import logging as transformers_logging

from rl.artifacts import LocalArtifacts
from rl.engines.torch_sampler import TorchSampler
from rl.identity import content_digest
from rl.loop.grpo import GrpoConfig, GrpoTiers
from rl.models.tiny import TinyModelConfig, build_tiny_model
from rl.problems import DigitSuccessor, constant_baseline_accuracy
from rl.protocols import Reporter
from rl.report import FileReporter
from rl.rewards import get_reward
from rl.scoring import RewardScorer, SamplingEvaluator
from rl.state import FileStateStore
from rl.trainer.config import TrainerConfig
from rl.trainer.peft_trainer import PeftTrainer
from rl.volumes.sink import VolumeRolloutSink

# A per-load "Loading weights" bar from transformers would bury the demo's own progress bar.
transformers_logging.disable_progress_bar()

# Measured to learn the digit task on 2 CPU cores: init 0.2, LoRA on every linear layer, lr 1e-2, 8 prompts x 8.
DEMO_MODEL = TinyModelConfig(seed=0, initializer_range=0.2)
DEMO_TRAINER = TrainerConfig(lr=1e-2, threads=1)


@dataclass(frozen=True)
class LocalDeployment:
    tiers: GrpoTiers
    store: FileStateStore
    reporter: FileReporter
    base_dir: Path


def base_model(root: Path, config: TinyModelConfig) -> Path:
    """The tiny base model for `config`, built once under `root` (the directory name carries the config's digest)."""
    target = Path(root) / f"base-{content_digest(config)[:12]}"
    if not (target / "config.json").is_file():
        build_tiny_model(target, config)
    return target


def check_local_grpo(config: GrpoConfig, reward: str = "default") -> None:
    """Refuse a configuration or reward name `local_grpo` cannot run, before it writes anything (a base model,
    artifacts, volumes): an `InputError` (`GrpoInputError`, `UnknownRewardError`) saying what to change."""
    config.validate(DigitSuccessor().train_prompts())
    get_reward(reward)


def local_grpo(
    out_dir: Path,
    config: GrpoConfig,
    *,
    model: TinyModelConfig = DEMO_MODEL,
    trainer: TrainerConfig = DEMO_TRAINER,
    reward: str = "default",
    reporter: Reporter | None = None,
    report_interval_s: float = 2.0,
    buffer: bool = True,
) -> LocalDeployment:
    """Assemble the tiers under `out_dir`: base-*/ (model), artifacts/, volumes/ (rollout buffer), checkpoint.json,
    metrics.jsonl and report.html."""
    check_local_grpo(config, reward)
    out_dir = Path(out_dir).absolute()
    base = base_model(out_dir, model)
    artifacts = LocalArtifacts(out_dir / "artifacts")
    problems = DigitSuccessor()
    engine = TorchSampler(base, artifacts, threads=trainer.threads)
    file_reporter = FileReporter(
        out_dir, min_interval_s=report_interval_s, baseline_accuracy=constant_baseline_accuracy(problems.eval_prompts())
    )
    tiers = GrpoTiers(
        engine=engine,
        scorer=RewardScorer(reward),
        trainer=PeftTrainer(base, artifacts, trainer),
        artifacts=artifacts,
        prompts=problems,
        evaluator=SamplingEvaluator(engine, problems.eval_prompts(), max_tokens=config.max_tokens),
        reporter=reporter if reporter is not None else file_reporter,
        buffer=VolumeRolloutSink(out_dir / "volumes") if buffer else None,
        task_metrics=problems.metrics,
    )
    return LocalDeployment(tiers, FileStateStore(out_dir / "checkpoint.json"), file_reporter, base)
