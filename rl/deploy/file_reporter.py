"""The local `Reporter`: a run directory's `metrics.jsonl` and `report.html`, written as the loop goes."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path

from rl.deploy.report import render_report
from rl.storage.run_layout import RunLayout
from rl.storage.safe_fs import Tree
from rl.strict_json import flag_non_finite
from rl.types import EvalResult, IterationMetrics


class FileReporter:
    """Reporter writing `metrics.jsonl` (one IterationMetrics per line) and `report.html` into a directory.

    The JSONL is brought up to date on every publication (new rows appended), so it is never behind. The HTML (ten
    matplotlib charts) is always rendered on completion; while running, at most every `min_interval_s`
    seconds and never more often than keeps rendering under `max_render_share` of the run's time (the next render
    waits `seconds / share` after one that took `seconds`), so a fast loop does not spend its time drawing charts.
    """

    def __init__(
        self,
        out_dir: Path,
        *,
        min_interval_s: float = 2.0,
        max_render_share: float = 0.05,
        baseline_accuracy: float | None = None,
        title: str = "GRPO run",
    ) -> None:
        if not 0.0 < max_render_share <= 1.0:
            raise ValueError(f"max_render_share must be in (0, 1], got {max_render_share!r}")
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        # metrics.jsonl and report.html are opened without following a link planted (or swapped in) at their names.
        self._fs = Tree(self.out_dir)
        self.min_interval_s, self.baseline_accuracy, self.title = min_interval_s, baseline_accuracy, title
        self.max_render_share = max_render_share
        self._next_render_at = float("-inf")
        self.renders = 0
        self._written: list[IterationMetrics] = []

    @property
    def metrics_path(self) -> Path:
        return RunLayout(self.out_dir).metrics

    def _write_metrics(self, history: Sequence[IterationMetrics]) -> None:
        """Rewrite `metrics.jsonl`, or append only the new rows when the rows written last are still the history's
        first rows (the same objects: a row the driver changed afterwards, an evaluation's time added, is a new
        object, and the file is rewritten). Rewriting every row each iteration was a run's only quadratic cost."""
        written = self._written
        if written and len(history) >= len(written) and all(a is b for a, b in zip(written, history, strict=False)):
            new_rows, mode = history[len(written) :], "a"
        else:
            new_rows, mode = history, "w"
        # A diverged run's NaN loss is written as null and named in the row's `non_finite` (strict JSON readers
        # reject `NaN`); IterationMetrics.from_dict puts it back.
        text = "".join(json.dumps(flag_non_finite(row.to_dict()), allow_nan=False) + "\n" for row in new_rows)
        with self._fs.open_file(self.metrics_path, mode, encoding="utf-8") as f:
            f.write(text)
        self._written = list(history)

    @property
    def report_path(self) -> Path:
        return RunLayout(self.out_dir).report

    async def publish(
        self, history: Sequence[IterationMetrics], *, status: str, evals: Sequence[EvalResult] = ()
    ) -> None:
        self._write_metrics(history)
        started = time.monotonic()
        if status != "running" or started >= self._next_render_at:
            page = render_report(
                history, status=status, evals=evals, baseline_accuracy=self.baseline_accuracy, title=self.title
            )
            with self._fs.open_file(self.report_path, "w", encoding="utf-8") as f:
                f.write(page)
            self.renders += 1
            now = time.monotonic()
            self._next_render_at = now + max(self.min_interval_s, (now - started) / self.max_render_share)
