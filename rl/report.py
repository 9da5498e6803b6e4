"""The run report: reward, accuracy, format rate and loss per iteration as charts, plus the best sample.

`render_report` is pure (history in, HTML out) so the Flyte driver (`flyte.report.replace`) and the local demo
(`report.html`) publish the same page. Charts are matplotlib SVGs inlined in the page, so it opens offline.
"""

from __future__ import annotations

import html
import io
import json
import time
from collections.abc import Sequence
from pathlib import Path

from rl.types import EvalResult, IterationMetrics

_PANELS = (
    ("mean_reward", "mean reward"),
    ("accuracy", "accuracy"),
    ("format_rate", "format rate"),
    ("mean_loss", "loss"),
)


def _charts_svg(history: Sequence[IterationMetrics], evals: Sequence[EvalResult], baseline: float | None) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    iterations = [row.iteration for row in history]
    fig, axes = plt.subplots(1, len(_PANELS), figsize=(4 * len(_PANELS), 3), constrained_layout=True)
    for ax, (field, title) in zip(axes, _PANELS, strict=True):
        ax.plot(iterations, [getattr(row, field) for row in history], color="#3b82f6", linewidth=1.2, label="train")
        if field == "accuracy":
            if evals:
                ax.plot(
                    [e.policy_version - 1 for e in evals],
                    [e.avg_at_k for e in evals],
                    color="#f97316",
                    linewidth=1.2,
                    label="held-out avg@k",
                )
            if baseline is not None:
                ax.axhline(baseline, color="#94a3b8", linestyle="--", linewidth=1, label="best constant answer")
            ax.legend(fontsize=7, loc="upper left")
        if field in ("accuracy", "format_rate"):
            ax.set_ylim(0, 1)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("iteration", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    buffer = io.StringIO()
    fig.savefig(buffer, format="svg")
    plt.close(fig)
    svg = buffer.getvalue()
    return svg[svg.index("<svg") :]


def render_report(
    history: Sequence[IterationMetrics],
    *,
    status: str,
    evals: Sequence[EvalResult] = (),
    baseline_accuracy: float | None = None,
    title: str = "GRPO run",
) -> str:
    """A self-contained HTML page: status line, charts, the latest row's numbers and the best sample."""
    if not history:
        head = f"<h2>{html.escape(title)}</h2><p>status: {html.escape(status)} · no iteration yet</p>"
        return f"<html><body>{head}</body></html>"
    last = history[-1]
    best = max(history, key=lambda row: row.sample_reward)
    latest_eval = (
        f" · held-out avg@{evals[-1].k} {evals[-1].avg_at_k:.3f}, pass@{evals[-1].k} {evals[-1].pass_at_k:.3f}"
        if evals
        else ""
    )
    return f"""<html><head><meta charset="utf-8"><title>{html.escape(title)}</title></head>
<body style="font-family: sans-serif; max-width: 1200px">
<h2>{html.escape(title)}</h2>
<p>status: <b>{html.escape(status)}</b> · iteration {last.iteration} · adapter v{last.adapter_version} ·
mean reward {last.mean_reward:.3f} · accuracy {last.accuracy:.3f} · format {last.format_rate:.3f} ·
loss {last.mean_loss:.4f}{latest_eval}</p>
{_charts_svg(history, evals, baseline_accuracy)}
<h3>Best sample (iteration {best.iteration}, reward {best.sample_reward:.2f})</h3>
<pre>{html.escape(best.sample_question)}{html.escape(best.sample_completion)}</pre>
</body></html>"""


class FileReporter:
    """Reporter writing `metrics.jsonl` (one IterationMetrics per line) and `report.html` into a directory.

    The HTML is re-rendered at most every `min_interval_s` seconds while running (charts cost ~0.1 s) and always on
    completion; the JSONL is rewritten on every publication, so it is never behind.
    """

    def __init__(
        self,
        out_dir: Path,
        *,
        min_interval_s: float = 2.0,
        baseline_accuracy: float | None = None,
        title: str = "GRPO run",
    ) -> None:
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.min_interval_s, self.baseline_accuracy, self.title = min_interval_s, baseline_accuracy, title
        self._rendered_at = float("-inf")

    @property
    def metrics_path(self) -> Path:
        return self.out_dir / "metrics.jsonl"

    @property
    def report_path(self) -> Path:
        return self.out_dir / "report.html"

    async def publish(
        self, history: Sequence[IterationMetrics], *, status: str, evals: Sequence[EvalResult] = ()
    ) -> None:
        self.metrics_path.write_text("".join(json.dumps(row.to_dict()) + "\n" for row in history))
        now = time.monotonic()
        if status != "running" or now - self._rendered_at >= self.min_interval_s:
            page = render_report(
                history, status=status, evals=evals, baseline_accuracy=self.baseline_accuracy, title=self.title
            )
            self.report_path.write_text(page)
            self._rendered_at = now
