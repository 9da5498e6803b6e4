"""The run report: what a practitioner watches per iteration, as charts that wrap to the window, plus recent samples.

`render_report` is pure (history in, HTML out) so the Flyte driver (`flyte.report.replace`) and the local demo
(`report.html`) publish the same page. Each chart is its own small matplotlib SVG inlined in a CSS grid, so the page
opens offline and reflows from a phone to a wide monitor instead of overflowing one wide figure.

The panels (`panels`): reward; one per task metric the run's rows carry (the task defines them: accuracy for the
digit task, plus format rate for a `####` task), with the held-out avg@k and the best constant answer on accuracy;
loss; KL to the reference; clip fraction; gradient norm; the fraction of groups with no signal (all rewards equal);
completion length; seconds per phase.
"""

from __future__ import annotations

import html
import io
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rl.errors import shown
from rl.types import EvalResult, IterationMetrics

RECENT_SAMPLES = 8
_SAMPLE_CHARS = 600  # a 512-token completion would make one table row a page long
_PHASES = ("generate", "score", "train", "evaluate")
_COLORS = ("#3b82f6", "#f97316", "#10b981", "#a855f7")


@dataclass(frozen=True)
class Series:
    label: str
    x: list[float]
    y: list[float]
    dashed: bool = False


@dataclass(frozen=True)
class Panel:
    """One chart: `key` is stable (the page's `data-panel`), `title` is what a reader sees."""

    key: str
    title: str
    series: list[Series]
    unit_range: bool = False
    from_zero: bool = False  # a quantity that is never negative: its axis starts at 0
    reference: tuple[str, float] | None = None  # a horizontal line: (label, y)
    caption: str = ""


def _series(
    label: str,
    rows: Sequence[IterationMetrics],
    value: Callable[[IterationMetrics], float | None],
    *,
    dashed: bool = False,
) -> Series:
    """The rows' values of `value(row)` against their iteration, leaving out rows where it is None."""
    points = [(row.iteration, v) for row in rows if (v := value(row)) is not None]
    return Series(label, [float(x) for x, _ in points], [float(y) for _, y in points], dashed)


def _stepped(label: str, rows: Sequence[IterationMetrics], value: Callable[[IterationMetrics], float]) -> Series:
    """A train-step statistic, left out where no sample contributed: the trainer took no step and measured nothing,
    and its zeros there would read as a KL or loss of 0."""
    return _series(label, rows, lambda r: value(r) if r.contributing else None)


def _entry_series(
    label: str, rows: Sequence[IterationMetrics], entries: Callable[[IterationMetrics], dict[str, float]], key: str
) -> Series:
    """`_series` of one key of a per-row dict (a task metric, a phase), leaving out rows that lack it."""
    return _series(label, rows, lambda r: entries(r).get(key))


def _task_metric_names(history: Sequence[IterationMetrics]) -> list[str]:
    names: dict[str, None] = {}
    for row in history:
        names.update(dict.fromkeys(row.task_metrics))
    return list(names)


def _title(name: str) -> str:
    return name.replace("_", " ")


_VALUE_CHARS = 200  # a name or value longer than this is cut (a megabyte of metric name would be one status line)


def _literal(text: str) -> str:
    """`text` as matplotlib draws it literally, after the report's one rule (`_e`'s `shown`): a `$` would start
    mathtext, and a task metric named `$\\foo{$` (from a run directory someone sent) would crash the report."""
    return shown(text, _VALUE_CHARS).replace("$", r"\$")


def _e(value: object, limit: int = _VALUE_CHARS, *, keep: str = "") -> str:
    """Any value as HTML text, whatever its type: the one rule for everything the report prints (a checkpoint read
    from a sent directory is schema-checked, but the report does not rely on that). `rl.errors.shown` first (control
    characters visible, all but `keep`; cut to `limit`), then HTML escaping, quotes included, so the same text is safe
    in an element and in an attribute."""
    return html.escape(shown(value, limit, keep=keep), quote=True)


def panels(
    history: Sequence[IterationMetrics], evals: Sequence[EvalResult] = (), baseline_accuracy: float | None = None
) -> list[Panel]:
    """The report's charts for `history`, in page order.

    Every run gets the reward, trainer and batch charts, drawn empty until there is a point (a run whose groups all
    had equal rewards has taken no step yet); the task's charts are the metrics its rows carry, the held-out chart
    needs evaluations and the phase chart timings (rows of older releases have none).
    """
    return [
        _reward_panel(history),
        *_task_panels(history, evals, baseline_accuracy),
        *_trainer_panels(history),
        *_batch_panels(history),
        *_phase_panels(history),
    ]


def _reward_panel(history: Sequence[IterationMetrics]) -> Panel:
    return Panel(
        "reward",
        "reward",
        [
            _series("mean", history, lambda r: r.mean_reward),
            _series("max", history, lambda r: r.max_reward, dashed=True),
        ],
    )


def _task_panels(
    history: Sequence[IterationMetrics], evals: Sequence[EvalResult], baseline_accuracy: float | None
) -> list[Panel]:
    """One chart per task metric the rows carry, accuracy with the held-out evaluations beside it (or on a chart of
    their own when the task has no accuracy)."""
    out = []
    held_out = Series(
        f"held-out avg@{evals[-1].k}" if evals else "held-out",
        [float(e.policy_version - 1) for e in evals],
        [e.avg_at_k for e in evals],
    )
    names = _task_metric_names(history)
    for name in names:
        train = _entry_series("train", history, lambda r: r.task_metrics, name)
        is_accuracy = name == "accuracy"
        out.append(
            Panel(
                f"task:{name}",
                _title(name),
                [train, held_out] if is_accuracy and evals else [train],
                unit_range=all(0.0 <= y <= 1.0 for y in train.y),
                reference=("best constant answer", baseline_accuracy)
                if is_accuracy and baseline_accuracy is not None
                else None,
            )
        )
    if evals and "accuracy" not in names:
        out.append(Panel("heldout", "held-out accuracy", [held_out], unit_range=True))
    return out


def _trainer_panels(history: Sequence[IterationMetrics]) -> list[Panel]:
    """The train step's statistics, a point only where a step was taken."""
    return [
        Panel("loss", "loss", [_stepped("loss", history, lambda r: r.mean_loss)]),
        Panel("kl", "KL to the reference (k3)", [_stepped("kl", history, lambda r: r.kl)], from_zero=True),
        Panel("clip_frac", "clip fraction", [_stepped("clip fraction", history, lambda r: r.clip_frac)], True),
        Panel(
            "grad_norm",
            "gradient norm (before clipping)",
            [_stepped("grad norm", history, lambda r: r.grad_norm)],
            from_zero=True,
        ),
    ]


def _batch_panels(history: Sequence[IterationMetrics]) -> list[Panel]:
    """What each iteration's batch held: its groups without signal, its completions' lengths."""
    return [
        Panel(
            "no_signal",
            "groups with no signal (all rewards equal)",
            [_series("fraction", history, lambda r: r.no_signal_groups / r.num_groups if r.num_groups else None)],
            unit_range=True,
            caption="An iteration where every group had no signal takes no step: loss, KL, clip fraction and "
            "gradient norm have no point there.",
        ),
        Panel(
            "completion_tokens",
            "completion length (tokens)",
            [
                _series("mean", history, lambda r: r.mean_completion_tokens),
                _series("max", history, lambda r: r.max_completion_tokens, dashed=True),
            ],
            from_zero=True,
        ),
    ]


def _phase_panels(history: Sequence[IterationMetrics]) -> list[Panel]:
    """The seconds per phase, when the rows carry timings (rows of older releases have none)."""
    phases = [series for p in _PHASES if (series := _entry_series(p, history, lambda r: r.phase_s, p)).x]
    if not phases:
        return []
    return [
        Panel(
            "phase_s",
            "seconds per phase",
            phases,
            from_zero=True,
            caption="On the driver's clock. Evaluation runs beside the next iteration, and pipelined generation "
            "beside training, so the phases can add up to more than an iteration took.",
        )
    ]


def _svg(panel: Panel, iterations: tuple[int, int]) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    # Text as <text>, not glyph paths: a tenth of the bytes, and the browser's font at any zoom.
    with plt.rc_context({"svg.fonttype": "none", "font.size": 8}):
        fig, ax = plt.subplots(figsize=(4.0, 2.6), constrained_layout=True)
        for color, s in zip(_COLORS, panel.series, strict=False):
            # A lone point, or a series with gaps (evaluations, iterations without a step), shows its points: a line
            # alone would draw nothing, or hide the gaps.
            gaps = len(s.x) < 2 or any(b - a > 1 for a, b in zip(s.x, s.x[1:], strict=False))
            marker = "o" if gaps else None
            linestyle = "--" if s.dashed else "-"
            ax.plot(
                s.x,
                s.y,
                color=color,
                linewidth=1.2,
                linestyle=linestyle,
                marker=marker,
                markersize=2.5,
                label=_literal(s.label),
            )
        if panel.reference is not None:
            label, y = panel.reference
            ax.axhline(y, color="#94a3b8", linestyle=":", linewidth=1, label=_literal(label))
        first, last = iterations  # every chart spans the whole run, even where its series has no point
        pad = max(0.5, 0.02 * (last - first))  # so a marker on the first or last iteration is not cut in half
        ax.set_xlim(first - pad, last + pad)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
        if panel.from_zero:
            # A diverged step's inf or NaN is not drawn (matplotlib skips it) and must not set the frame: an infinite
            # axis limit raises, and the run would die in its reporter.
            top = max((y for s in panel.series for y in s.y if math.isfinite(y)), default=0.0)
            headroom = top * 1.08  # so a flat series does not hide in the frame
            ax.set_ylim(0, (headroom if math.isfinite(headroom) else top) if top > 0 else 1.0)
        if panel.unit_range:
            ax.set_ylim(-0.03, 1.03)  # a rate pinned at 0 or 1 stays visible off the frame
        if len(panel.series) > 1 or panel.reference is not None:
            ax.legend(fontsize=7, loc="best")
        ax.set_title(_literal(panel.title), fontsize=9)
        ax.set_xlabel("iteration", fontsize=7)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        buffer = io.StringIO()
        fig.savefig(buffer, format="svg", metadata=dict.fromkeys(("Date", "Creator", "Format", "Type")))
        plt.close(fig)
    svg = buffer.getvalue()
    return svg[svg.index("<svg") :]


def _fmt(value: float, digits: int = 3) -> str:
    if not isinstance(value, int | float):
        return _e(value)
    return f"{value:.{digits}f}" if math.isfinite(value) else str(value)


def _status(history: Sequence[IterationMetrics], evals: Sequence[EvalResult], status: str) -> str:
    last = history[-1]
    parts = [
        f"status: <b>{_e(status)}</b>",
        f"iteration {_e(last.iteration)} · policy v{_e(last.policy_version)}",
        f"mean reward {_fmt(last.mean_reward)}",
        *(f"{_e(_title(name))} {_fmt(value)}" for name, value in last.task_metrics.items()),
    ]
    if last.contributing:
        parts += [f"loss {_fmt(last.mean_loss, 4)}", f"KL {_fmt(last.kl, 4)}", f"clip fraction {_fmt(last.clip_frac)}"]
    else:
        parts.append("no step (no group had signal)")
    if last.num_groups:
        parts.append(f"no-signal groups {_e(last.no_signal_groups)}/{_e(last.num_groups)}")
    if evals:
        e = evals[-1]
        parts.append(f"held-out avg@{_e(e.k)} {_fmt(e.avg_at_k)}, pass@{_e(e.k)} {_fmt(e.pass_at_k)}")
    if last.phase_s:
        parts.append("seconds: " + ", ".join(f"{p} {_fmt(last.phase_s[p], 2)}" for p in _PHASES if p in last.phase_s))
    return " · ".join(parts)


def _samples_table(history: Sequence[IterationMetrics]) -> str:
    rows = []
    for row in reversed(history[-RECENT_SAMPLES:]):
        text = _e(f"{row.sample_question}{row.sample_completion}", _SAMPLE_CHARS, keep="\n\t")  # a sample's lines
        rows.append(
            f"<tr><td>{_e(row.iteration)}</td><td>{_fmt(row.sample_reward, 2)}</td><td><code>{text}</code></td></tr>"
        )
    return (
        '<table class="samples"><colgroup><col style="width:6em"><col style="width:6em"><col></colgroup>'
        "<thead><tr><th>iteration</th><th>reward</th><th>prompt + completion</th></tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table>"
    )


_STYLE = """
body { font-family: sans-serif; margin: 8px; max-width: 1600px; }
.charts { display: grid; grid-template-columns: repeat(auto-fill, minmax(min(300px, 100%), 1fr)); gap: 8px; }
.panel { margin: 0; min-width: 0; }
.panel figcaption { font-size: 11px; color: #64748b; }
.panel svg { display: block; width: 100%; max-width: 100%; height: auto; }
.samples { width: 100%; table-layout: fixed; border-collapse: collapse; font-size: 13px; }
.samples th, .samples td { text-align: left; vertical-align: top; padding: 2px 6px; border-bottom: 1px solid #e2e8f0; }
.samples code { white-space: pre-wrap; overflow-wrap: anywhere; }
"""


def render_report(
    history: Sequence[IterationMetrics],
    *,
    status: str,
    evals: Sequence[EvalResult] = (),
    baseline_accuracy: float | None = None,
    title: str = "GRPO run",
) -> str:
    """A self-contained HTML page: status line, one chart per panel, and one sample from each recent iteration."""
    head = (
        f'<html><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{_e(title)}</title><style>{_STYLE}</style></head>"
    )
    if not history:
        body = f"<h2>{_e(title)}</h2><p>status: {_e(status)} · no iteration yet</p>"
        return f"{head}<body>{body}</body></html>"
    span = (history[0].iteration, history[-1].iteration)
    charts = "".join(
        f'<figure class="panel" data-panel="{_e(p.key)}">{_svg(p, span)}'
        + (f"<figcaption>{_e(p.caption, 1000)}</figcaption>" if p.caption else "")
        + "</figure>"
        for p in panels(history, evals, baseline_accuracy)
    )
    return f"""{head}<body>
<h2>{_e(title)}</h2>
<p>{_status(history, evals, status)}</p>
<div class="charts">{charts}</div>
<h3>Recent samples (one per iteration, as drawn, not the best)</h3>
{_samples_table(history)}
</body></html>"""
