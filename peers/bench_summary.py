"""The side-by-side table of `nox -s bench-peers`, from the runners' `RunRecord`s. Pure Python.

Per seed, each side's figures over its steady state (the first `warmup` iterations dropped: model load, first-call
allocations, TRL's lazy set-up): the median wall seconds per iteration, the mean CPU seconds per iteration, generated
tokens per CPU-second of generation; then the peak RSS of the whole process and the training accuracy over the last
tenth of all iterations, and on a real-model shape the held-out accuracy after the last one. Across seeds each figure
is shown as its median with the spread (min-max), and the ratio ours/TRL of the medians: below 1 means ours is smaller
(faster, for the time figures).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from peers.bench_shapes import SHAPES, BenchInputError, RunRecord

IMPLS = ("ours", "trl")


def last_tenth(values: Sequence[float]) -> list[float]:
    """The last tenth of `values` (at least one), the window `rl demo grpo` reports `accuracy_last` over."""
    return list(values[-max(1, len(values) // 10) :])


def _tokens_per_cpu_s(r: RunRecord, warmup: int) -> float:
    cpu = sum(r.gen_cpu_s[warmup:])
    return sum(r.gen_tokens[warmup:]) / cpu if cpu > 0 else math.nan


@dataclass(frozen=True)
class Figure:
    """One row of the table: its label, how to compute it from one seed's record, and its print format."""

    label: str
    of_seed: Callable[[RunRecord, int], float]
    fmt: str


FIGURES = (
    Figure("wall s/iter, steady (median)", lambda r, w: statistics.median(r.wall_s[w:]), ".3f"),
    Figure("CPU s/iter, steady (mean)", lambda r, w: statistics.fmean(r.cpu_s[w:]), ".3f"),
    Figure("generation tokens per CPU-s", _tokens_per_cpu_s, ",.0f"),
    Figure("peak RSS MiB", lambda r, w: r.peak_rss_mib, ",.0f"),
    Figure("training accuracy, last tenth", lambda r, w: statistics.fmean(last_tenth(r.accuracy)), ".3f"),
)
HELDOUT = Figure("held-out accuracy after the last iteration", lambda r, w: r.heldout_correct / r.heldout_total, ".3f")
"""Shown for a shape whose every record was evaluated (the real-model shapes: `rl.bench.heldout`)."""


@dataclass(frozen=True)
class Spread:
    """A figure over seeds: the median and the min-max."""

    median: float
    low: float
    high: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        return cls(statistics.median(values), min(values), max(values))

    def show(self, fmt: str) -> str:
        return f"{self.median:{fmt}} ({self.low:{fmt}}-{self.high:{fmt}})"


@dataclass(frozen=True)
class Row:
    label: str
    ours: Spread
    trl: Spread
    fmt: str

    @property
    def ratio(self) -> float:
        """ours/TRL of the medians; NaN where TRL's is 0 or either is NaN."""
        return self.ours.median / self.trl.median if self.trl.median else math.nan


def check_records(records: Sequence[RunRecord], warmup: int) -> None:
    """Refuse records the table cannot be built from: an unknown shape, too few iterations for `warmup`, a shape run
    by one side only."""
    if warmup < 0:
        raise BenchInputError(f"warmup must be >= 0, got {warmup}")
    for r in records:
        if r.shape not in SHAPES or r.impl not in IMPLS:
            raise BenchInputError(f"a record for {r.impl!r} on shape {r.shape!r}: known {IMPLS} on {sorted(SHAPES)}")
        if len(r.wall_s) <= warmup:
            raise BenchInputError(
                f"{r.impl} {r.shape} seed {r.seed} trained {len(r.wall_s)} iterations; the steady state excludes the "
                f"first {warmup}: run more than {warmup} iterations or lower --warmup"
            )
    for shape in {r.shape for r in records}:
        missing = [i for i in IMPLS if not any(r.shape == shape and r.impl == i for r in records)]
        if missing:
            raise BenchInputError(f"shape {shape} has no record from {missing}; both sides must run each shape")


def summarise(records: Sequence[RunRecord], warmup: int) -> dict[str, list[Row]]:
    """`{shape: [Row per figure]}` in `SHAPES` order, over every seed's record of that shape."""
    check_records(records, warmup)
    out: dict[str, list[Row]] = {}
    for shape in (s for s in SHAPES if any(r.shape == s for r in records)):
        sides = {i: [r for r in records if r.shape == shape and r.impl == i] for i in IMPLS}
        evaluated = all(r.heldout_total > 0 for i in IMPLS for r in sides[i])
        figures = (*FIGURES, HELDOUT) if evaluated else FIGURES
        out[shape] = [
            Row(f.label, *(Spread.of([f.of_seed(r, warmup) for r in sides[i]]) for i in IMPLS), f.fmt) for f in figures
        ]
    return out


def format_table(shape: str, rows: Sequence[Row], *, seeds: int, iterations: int, warmup: int) -> str:
    """A markdown table of one shape, headed by what was run."""
    head = (
        f"shape {shape}: {SHAPES[shape].describe()}; {seeds} seed(s) x {iterations} iterations, the first {warmup} "
        "excluded from the steady-state figures; median over seeds (min-max)"
    )
    lines = [head, "", "| figure | ours | TRL | ours/TRL |", "| --- | --- | --- | --- |"]
    for row in rows:
        ratio = "-" if math.isnan(row.ratio) else f"{row.ratio:.2f}"
        lines.append(f"| {row.label} | {row.ours.show(row.fmt)} | {row.trl.show(row.fmt)} | {ratio} |")
    return "\n".join(lines)
