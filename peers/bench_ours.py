"""Our side of `nox -s bench-peers`: `rl demo grpo`'s loop, durability included, timed per iteration.

`python -m peers.bench_ours --shape demo --iterations 40 --seed 0` builds the demo's deployment
(`rl.deploy.local.local_grpo`: tiny base model, torch sampler, PEFT trainer, artifacts and checkpoint on disk, the
rollout buffer on, the report re-rendered every 15 s as the demo does) in a temporary directory, runs
`rl.loop.grpo.run_grpo` with evaluation off, and prints one `RunRecord` JSON line.

Timing sits outside the loop, so it measures whatever the loop does today: the driver publishes the report once per
trained iteration, and a Reporter wrapper marks the clocks there; the engine's `generate*` coroutines mark when
generation starts and ends (any of them, so a batched generate call is timed too).

A real-model shape (`--shape smollm2`) builds `rl demo grpo --model smollm2`'s run instead (`grpo_demo_config`,
`REAL_MODEL_TRAINER`, `Addition`'s prompts) and, after training, evaluates the last checkpoint's adapter with
`rl.bench.heldout.heldout_accuracy`, outside the iteration times.
"""

from __future__ import annotations

import asyncio
import functools
import os
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

import rl
from peers.bench_shapes import (
    HELDOUT_SAMPLES,
    SHAPES,
    IterationClock,
    RepeatedDigits,
    RunRecord,
    Shape,
    peak_rss_mib,
    runner_args,
)
from rl.bench.heldout import heldout_accuracy, trained_policy
from rl.deploy.demo import grpo_demo_config
from rl.deploy.local import DEMO_TRAINER, REAL_MODEL_TRAINER, LocalDeployment, local_grpo
from rl.loop.grpo import GrpoConfig, run_grpo
from rl.models import load_tokenizer
from rl.models.pretrained import resolve_model
from rl.protocols import Reporter
from rl.storage.run_dir import RunDir, open_run
from rl.types import EvalResult, IterationMetrics

DEMO_REPORT_INTERVAL_S = 15.0
"""What `rl demo grpo` passes to `local_grpo` (rl/deploy/demo.py): the report is rendered at most this often."""


def time_generation(engine: Any, clock: IterationClock) -> None:
    """Note on `clock` when each of `engine`'s `generate*` coroutines starts and ends. Patched on the instance, not
    wrapped in a proxy, so the engine keeps its type for any driver that asks what it is."""
    for name in dir(engine):
        method = getattr(engine, name, None)
        if name.startswith("generate") and asyncio.iscoroutinefunction(method):
            setattr(engine, name, _timed(method, clock))


def _timed(method: Any, clock: IterationClock) -> Any:
    @functools.wraps(method)
    async def timed(*args: Any, **kwargs: Any) -> Any:
        clock.generation_started()
        try:
            return await method(*args, **kwargs)
        finally:
            clock.generation_ended()

    return timed


class TimedReporter:
    """The deployment's reporter; each publish of a new trained iteration closes that iteration on `clock` (the time
    includes the report's own rendering, as in the demo) and appends its figures to `record`."""

    def __init__(self, inner: Reporter, clock: IterationClock, record: RunRecord) -> None:
        self.inner, self.clock, self.record = inner, clock, record

    async def publish(
        self, history: Sequence[IterationMetrics], *, status: str, evals: Sequence[EvalResult] = ()
    ) -> None:
        await self.inner.publish(history, status=status, evals=evals)
        if status != "running":
            return
        if not history:  # the publish before the first iteration: the clock starts here
            self.clock.mark()
            return
        if len(history) == len(self.record.wall_s):
            return
        row = history[-1]
        wall, cpu, gen_cpu = self.clock.mark()
        self.record.wall_s.append(wall)
        self.record.cpu_s.append(cpu)
        self.record.gen_cpu_s.append(gen_cpu)
        self.record.gen_tokens.append(round(row.mean_completion_tokens * row.num_rollouts))
        self.record.accuracy.append(float(row.task_metrics["accuracy"]))


def real_model_deployment(
    run_dir: RunDir, shape: Shape, iterations: int, seed: int
) -> tuple[GrpoConfig, LocalDeployment]:
    """`rl demo grpo --model M`'s run (its config, trainer and `Addition` prompts), its end-of-run evaluation off:
    the runner evaluates after training, as TRL's does."""
    assert shape.model is not None
    config = grpo_demo_config(
        iterations=iterations, seed=seed, prompts=shape.prompts, samples=shape.samples, real_model=True
    )
    if config.max_tokens != shape.max_tokens:
        raise ValueError(f"the demo samples {config.max_tokens} tokens on a real model, the shape {shape.max_tokens}")
    config = replace(config, evaluate=False)
    dep = local_grpo(
        run_dir,
        config,
        trainer=REAL_MODEL_TRAINER,
        model_dir=resolve_model(shape.model),
        report_interval_s=DEMO_REPORT_INTERVAL_S,
    )
    return config, dep


async def run(out: Path, shape_name: str, iterations: int, seed: int) -> RunRecord:
    with open_run(out, command="python -m peers.bench_ours") as run_dir:
        return await _run(run_dir, shape_name, iterations, seed)


async def _run(run_dir: RunDir, shape_name: str, iterations: int, seed: int) -> RunRecord:
    shape = SHAPES[shape_name]
    clock = IterationClock()
    record = RunRecord(impl="ours", shape=shape_name, seed=seed, version=f"rl-{rl.__version__}")
    if shape.model is not None:
        config, dep = real_model_deployment(run_dir, shape, iterations, seed)
        time_generation(dep.tiers.engine, clock)
        tiers = replace(dep.tiers, reporter=TimedReporter(dep.reporter, clock, record))
        await run_grpo(config, tiers, dep.store)
        record.peak_rss_mib = peak_rss_mib()
        return record
    config = GrpoConfig(
        iterations=iterations,
        prompts_per_iteration=shape.prompts,
        group_size=shape.samples,
        max_tokens=shape.max_tokens,
        evaluate=False,
        seed=seed,
    )
    prompts = RepeatedDigits(shape.prompts)
    # local_grpo checks the configuration against the digit task's ten prompts; the large shape draws 32 from the
    # same prompts repeated (bench_prompts), so the deployment is built with a draw it accepts, run with the real one.
    buildable = replace(config, prompts_per_iteration=min(shape.prompts, len(prompts.eval_prompts())))
    dep = local_grpo(run_dir, buildable, trainer=DEMO_TRAINER, report_interval_s=DEMO_REPORT_INTERVAL_S)
    time_generation(dep.tiers.engine, clock)
    tiers = replace(dep.tiers, prompts=prompts, reporter=TimedReporter(dep.reporter, clock, record))
    await run_grpo(config, tiers, dep.store)
    record.peak_rss_mib = peak_rss_mib()
    return record


def main(argv: list[str] | None = None) -> int:
    args = runner_args(argv, "python -m peers.bench_ours")
    shape = SHAPES[args.shape]
    with tempfile.TemporaryDirectory(prefix="bench-ours-") as tmp:
        record = asyncio.run(run(Path(tmp) / "run", args.shape, args.iterations, args.seed))
        if shape.model is not None:  # the last checkpoint's adapter, evaluated as TRL's trained model is (trl_loop)
            torch.set_num_threads(REAL_MODEL_TRAINER.threads)
            model_dir = resolve_model(shape.model)
            policy, _ = trained_policy(Path(tmp) / "run", model_dir)
            record.heldout_correct, record.heldout_total = heldout_accuracy(
                policy, load_tokenizer(model_dir), HELDOUT_SAMPLES
            )
    print(record.to_json(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
