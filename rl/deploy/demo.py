"""The GRPO demo: the driver on the local CPU deployment, with a progress bar and a summary a test can check."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from rl.deploy.local import DEMO_TRAINER, REAL_MODEL_TRAINER, demo_problems, local_grpo
from rl.loop.grpo import GrpoConfig, run_grpo
from rl.models.opened_model import ModelDir
from rl.problems import constant_baseline_accuracy
from rl.protocols import Reporter
from rl.storage.run_dir import RunDir
from rl.types import EvalResult, IterationMetrics


def grpo_demo_config(
    *,
    iterations: int,
    seed: int = 0,
    prompts: int = 8,
    samples: int | None = None,
    pipelined: bool = False,
    real_model: bool = False,
) -> GrpoConfig:
    """The demo's run. The tiny model's completions are a digit and <eos> (3 tokens leave room for one stray
    character), in groups of 16 (`samples`; a group of 8 left a prompt stuck on a wrong answer too often); a real
    model's answer a sentence at most ("The answer is 12.<|im_end|>": 12 tokens), in groups of 8, and its held-out
    evaluation (36 problems x 8 samples) is costly, so it runs at the end only."""
    return GrpoConfig(
        iterations=iterations,
        prompts_per_iteration=prompts,
        group_size=samples if samples is not None else (8 if real_model else 16),
        seed=seed,
        max_tokens=12 if real_model else 3,
        pipelined=pipelined,
        eval_k=8,
        eval_every=iterations if real_model else max(1, iterations // 6),
    )


class ProgressReporter:
    """Advances a rich progress bar with each published iteration, then hands the publication on."""

    def __init__(self, inner: Reporter, progress: Progress, total: int) -> None:
        self.inner, self.progress = inner, progress
        self.task = progress.add_task("GRPO", total=total, accuracy=0.0, reward=0.0)

    async def publish(
        self, history: Sequence[IterationMetrics], *, status: str, evals: Sequence[EvalResult] = ()
    ) -> None:
        if history:
            recent = history[-10:]
            self.progress.update(
                self.task,
                completed=len(history),
                accuracy=_window_mean(recent),
                reward=sum(r.mean_reward for r in recent) / len(recent),
            )
        await self.inner.publish(history, status=status, evals=evals)


def _window_mean(rows: Sequence[IterationMetrics]) -> float:
    return sum(r.task_metrics["accuracy"] for r in rows) / len(rows)


async def run_demo(
    config: GrpoConfig,
    run: RunDir,
    *,
    console: Console | None = None,
    buffer: bool = True,
    engine: str = "torch",
    model_dir: ModelDir | None = None,
) -> dict[str, Any]:
    """Run (or resume) the demo in the opened run directory `run` with rollouts from `engine` (`torch` or `vllm`),
    on the tiny model or the real one in `model_dir`; return the summary the `--json` line carries."""
    progress = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("accuracy(last 10) {task.fields[accuracy]:.3f}  reward {task.fields[reward]:.3f}"),
        TimeElapsedColumn(),
        console=console,
    )
    trainer = REAL_MODEL_TRAINER if model_dir is not None else DEMO_TRAINER
    deployment = local_grpo(
        run, config, report_interval_s=15.0, buffer=buffer, engine=engine, model_dir=model_dir, trainer=trainer
    )
    try:
        with progress:
            reporter = ProgressReporter(deployment.reporter, progress, config.iterations)
            tiers = replace(deployment.tiers, reporter=reporter)
            outcome = await run_grpo(config, tiers, deployment.store)
    finally:
        close = getattr(deployment.tiers.engine, "close", None)
        if callable(close):  # vLLM's engine core is a process of its own: it ends with the run, not at exit
            close()
    history = outcome.history
    window = max(1, len(history) // 10)
    return {
        "iterations": len(history),
        "window": window,
        "accuracy_first": _window_mean(history[:window]),
        "accuracy_last": _window_mean(history[-window:]),
        "constant_baseline_accuracy": constant_baseline_accuracy(demo_problems(model_dir is not None).eval_prompts()),
        "model": str(model_dir.where) if model_dir is not None else "tiny",
        "heldout_avg_at_k_last": outcome.evals[-1].avg_at_k if outcome.evals else float("nan"),
        "heldout_pass_at_k_last": outcome.evals[-1].pass_at_k if outcome.evals else float("nan"),
        "policy_version": outcome.policy_version,
        "resumed_from": outcome.resumed_from,
        "engine": engine,
        "buffer_version": outcome.buffer_version,
        "report": str(deployment.reporter.report_path),
        "metrics": str(deployment.reporter.metrics_path),
    }
