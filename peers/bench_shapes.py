"""What both sides of `nox -s bench-peers` share: the shapes, the prompts, the runner flags and the JSON line each
runner prints. Pure Python (no torch, no TRL), so the orchestrator and its tests import it cheaply.

A runner (`python -m peers.bench_ours`, `python -m peers.trl_loop`) trains one seed of one shape in its own process and
prints one JSON line (`RunRecord`) as its last line of stdout: per-iteration wall and CPU seconds, generated tokens,
the CPU seconds spent generating them, training accuracy, and the process's peak RSS.
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from rl.errors import InputError
from rl.problems import DigitSuccessor
from rl.types import Prompt


class BenchInputError(InputError):
    """A benchmark flag or record that cannot work; the message says what to pass instead."""


@dataclass(frozen=True)
class Shape:
    """One iteration's size: `prompts` groups of `samples` completions, each at most `max_tokens` new tokens."""

    prompts: int
    samples: int
    max_tokens: int
    default_iterations: int
    model: str | None = None  # a pinned real model (`rl.models.pretrained.PINNED`); None: the demo's tiny model
    opt_in: bool = False  # left out of the default `--shapes` (it costs minutes)

    def describe(self) -> str:
        on = f" on {self.model}" if self.model else ""
        return f"{self.prompts} prompts x {self.samples} samples, {self.max_tokens} new tokens{on}"


SHAPES: dict[str, Shape] = {
    # The demo's shape before it sampled groups of 16 (rl.deploy.demo.grpo_demo_config), kept so the ratios in
    # docs/benchmarks.md stay comparable from one measurement to the next.
    "demo": Shape(prompts=8, samples=8, max_tokens=3, default_iterations=120),
    "large": Shape(prompts=32, samples=8, max_tokens=16, default_iterations=20),
    "smollm2": Shape(prompts=4, samples=8, max_tokens=12, default_iterations=6, model="smollm2", opt_in=True),
}
"""`demo` is `rl demo grpo`'s shape; `large` shows how each side scales with batch and length. The default iteration
counts keep a 3-seed `nox -s bench-peers` to about 2 minutes of runs on a quiet 2-core machine (93 s measured).
`smollm2` is `rl demo grpo --model smollm2`'s (Addition, chat template, `REAL_MODEL_TRAINER`), then held-out accuracy
(`rl.bench.heldout`); about 9 s an iteration a side on a quiet machine, so only with `--shapes smollm2`."""

DEFAULT_SHAPES = [name for name, shape in SHAPES.items() if not shape.opt_in]

HELDOUT_SAMPLES = 8
"""Samples per held-out problem when a real-model shape evaluates after training (36 problems: 288 samples)."""


def bench_prompts(prompts_per_iteration: int) -> list[Prompt]:
    """`DigitSuccessor`'s ten training prompts, repeated until an iteration can draw `prompts_per_iteration` of them
    without replacement (40 for the large shape's 32: each digit four times). Both sides draw from this same list."""
    base = list(DigitSuccessor().train_prompts())
    copies = max(1, math.ceil(prompts_per_iteration / len(base)))
    return base * copies


@dataclass(frozen=True)
class RepeatedDigits:
    """A `PromptSource` over `bench_prompts(prompts_per_iteration)`; held-out prompts are the task's own."""

    prompts_per_iteration: int

    def train_prompts(self) -> list[Prompt]:
        return bench_prompts(self.prompts_per_iteration)

    def eval_prompts(self) -> list[Prompt]:
        return list(DigitSuccessor().eval_prompts())


@dataclass
class RunRecord:
    """One runner's result: one entry per trained iteration in each list, in iteration order."""

    impl: str
    shape: str
    seed: int
    wall_s: list[float] = field(default_factory=list)
    cpu_s: list[float] = field(default_factory=list)
    gen_tokens: list[int] = field(default_factory=list)
    gen_cpu_s: list[float] = field(default_factory=list)
    accuracy: list[float] = field(default_factory=list)
    peak_rss_mib: float = 0.0
    version: str = ""
    heldout_correct: int = 0  # after the last iteration, real-model shapes only (rl.bench.heldout)
    heldout_total: int = 0

    def to_json(self) -> str:
        return json.dumps(asdict(self), allow_nan=False)

    @classmethod
    def from_json(cls, line: str) -> RunRecord:
        try:
            data: dict[str, Any] = json.loads(line)
            record = cls(**data)
        except (ValueError, TypeError) as e:
            raise BenchInputError(f"a runner printed {line[:200]!r}, not a RunRecord JSON line ({e})") from None
        lengths = {len(getattr(record, n)) for n in ("wall_s", "cpu_s", "gen_tokens", "gen_cpu_s", "accuracy")}
        if len(lengths) != 1 or not record.wall_s:
            raise BenchInputError(
                f"{record.impl} {record.shape} seed {record.seed}: per-iteration lists of unequal lengths or empty "
                f"({sorted(lengths)}); each list needs one entry per trained iteration"
            )
        return record


class IterationClock:
    """Marks iteration boundaries: wall (`perf_counter`) and process CPU (`process_time`) seconds since the last mark,
    and the CPU seconds of the generation window noted inside it (first generation start to last generation end)."""

    def __init__(self) -> None:
        self.wall, self.cpu = time.perf_counter(), time.process_time()
        self._gen_start: float | None = None
        self._gen_end: float | None = None

    def generation_started(self) -> None:
        if self._gen_start is None:
            self._gen_start = time.process_time()

    def generation_ended(self) -> None:
        self._gen_end = time.process_time()

    def mark(self) -> tuple[float, float, float]:
        """(wall s, CPU s, generation CPU s) since the previous mark; starts the next iteration."""
        wall, cpu = time.perf_counter(), time.process_time()
        gen = (self._gen_end - self._gen_start) if self._gen_start is not None and self._gen_end is not None else 0.0
        out = (wall - self.wall, cpu - self.cpu, gen)
        self.wall, self.cpu, self._gen_start, self._gen_end = wall, cpu, None, None
        return out


def peak_rss_mib() -> float:
    """This process's peak resident set size in MiB (`ru_maxrss` is KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1 << 20) if sys.platform == "darwin" else peak / 1024


def runner_args(argv: list[str] | None, prog: str) -> argparse.Namespace:
    """A runner's flags: `--shape NAME --iterations N --seed S`."""
    p = argparse.ArgumentParser(prog=prog, description="train one seed of one shape; print one RunRecord JSON line")
    p.add_argument("--shape", choices=sorted(SHAPES), required=True)
    p.add_argument("--iterations", type=int, required=True)
    p.add_argument("--seed", type=int, required=True)
    args = p.parse_args(argv)
    if args.iterations < 1:
        p.error(f"--iterations must be >= 1, got {args.iterations}")
    return args
