"""The report's content without a browser: which panels a run gets, what each draws, the recent-sample table."""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import replace

import pytest
from report_rows import MARKED_TASK, evals, rows

from rl.deploy.file_reporter import FileReporter
from rl.deploy.report import RECENT_SAMPLES, panels, render_report
from rl.types import IterationMetrics

TRAINER_PANELS = ["loss", "kl", "clip_frac", "grad_norm", "no_signal", "completion_tokens"]


def _keys(*args, **kwargs) -> list[str]:  # type: ignore[no-untyped-def]
    return [p.key for p in panels(*args, **kwargs)]


def _figures(page: str) -> list[str]:
    return re.findall(r'<figure class="panel" data-panel="([^"]+)">', page)


@pytest.mark.heavy
def test_the_digit_task_gets_an_accuracy_chart_and_no_format_rate_chart():
    """The digit task defines accuracy only, so the page draws accuracy and never mentions a format rate."""
    history = rows(12)
    assert _keys(history, evals(12), 0.1) == ["reward", "task:accuracy", *TRAINER_PANELS, "phase_s"]
    page = render_report(history, status="running", evals=evals(12), baseline_accuracy=0.1)
    assert "format rate" not in page and "format_rate" not in page
    assert _figures(page) == _keys(history, evals(12), 0.1)
    assert page.count("<svg") == len(_figures(page))  # one SVG per panel, not one wide figure


@pytest.mark.heavy
def test_a_task_that_defines_a_format_rate_gets_its_chart_and_status():
    history = rows(12, task=MARKED_TASK)
    assert "task:format_rate" in _keys(history)
    page = render_report(history, status="running")
    assert 'data-panel="task:format_rate"' in page and "format rate 0.160" in page


def test_accuracy_is_drawn_against_held_out_avg_at_k_and_the_best_constant_answer():
    """Held-out avg@k sits at the iteration that produced the evaluated adapter (policy version - 1)."""
    accuracy = next(p for p in panels(rows(12), evals(12), 0.1) if p.key == "task:accuracy")
    train, held_out = accuracy.series
    assert train.x == [float(i) for i in range(12)]
    assert held_out.label == "held-out avg@8" and held_out.x == [4.0, 9.0] and held_out.y == [0.05, 0.1]
    assert accuracy.reference == ("best constant answer", 0.1) and accuracy.unit_range


def test_held_out_accuracy_gets_its_own_chart_when_the_task_defines_no_accuracy():
    keys = _keys(rows(12, task=()), evals(12))
    assert "heldout" in keys and not any(k.startswith("task:") for k in keys)
    assert "heldout" not in _keys(rows(12, task=()))


def test_no_signal_chart_is_the_fraction_of_groups_and_skips_rows_without_a_group_count():
    history = rows(4)
    history[1] = replace(history[1], num_groups=0)  # a row written before num_groups existed
    (series,) = next(p for p in panels(history) if p.key == "no_signal").series
    assert series.x == [0.0, 2.0, 3.0] and series.y == [0 / 8, 2 / 8, 0 / 8]


def test_phase_chart_draws_each_phase_where_rows_have_it_and_is_left_out_without_timings():
    phase = next(p for p in panels(rows(12)) if p.key == "phase_s")
    by_label = {s.label: s for s in phase.series}
    assert list(by_label) == ["generate", "score", "train", "evaluate"]
    assert by_label["train"].x == [float(i) for i in range(12)] and by_label["evaluate"].x == [0.0, 5.0, 10.0]
    assert "phase_s" not in _keys(rows(12, phases=False))


@pytest.mark.heavy
def test_the_sample_table_shows_the_latest_iterations_newest_first_one_sample_each():
    """Not iteration 0 as "the best": the last RECENT_SAMPLES iterations, each with its own sample and reward."""
    history = rows(RECENT_SAMPLES + 5)
    page = render_report(history, status="complete")
    table = page[page.index('<table class="samples">') :]
    shown = [int(i) for i in re.findall(r"<tr><td>(\d+)</td>", table)]
    assert shown == list(range(len(history) - 1, len(history) - 1 - RECENT_SAMPLES, -1))
    last = history[-1]
    assert f"<td>{last.sample_reward:.2f}</td><td><code>q{last.iteration}=c{last.iteration}</code>" in table
    assert "<code>q0=c0</code>" not in page


@pytest.mark.heavy
def test_samples_are_escaped_and_long_completions_cut():
    page = render_report(rows(2, completion="<b>" + "x" * 2000), status="running")
    assert "<code>q1=&lt;b&gt;xxx" in page and "<b>x" not in page
    assert "x" * 700 not in page and "xxx… (" in page


@pytest.mark.heavy
def test_status_line_has_the_latest_rows_trainer_statistics_and_phase_seconds():
    history = rows(3)
    page = render_report(history, status="running", evals=evals(10, every=2)[:1])
    status = page[page.index("<p>status:") : page.index("</p>")]
    for text in (
        "iteration 2 · policy v3",
        "accuracy 0.070",
        "loss 0.0000",
        "KL 0.0020",
        "clip fraction 0.020",
        "no-signal groups 2/8",
        "held-out avg@8 0.020, pass@8 0.040",
        "seconds: generate 0.50, score 0.01, train 0.30",
    ):
        assert text in status, text


def test_an_empty_history_renders_a_page_without_charts():
    page = render_report([], status="running", title="T")
    assert "no iteration yet" in page and "<svg" not in page and "</h2>" in page


@pytest.mark.heavy
def test_file_reporter_writes_one_row_per_line_with_task_metrics_and_phase_seconds(tmp_path):
    reporter = FileReporter(tmp_path, min_interval_s=0.0)
    history = rows(3, task=MARKED_TASK)
    asyncio.run(reporter.publish(history, status="complete"))
    lines = reporter.metrics_path.read_text().splitlines()
    loaded = [IterationMetrics.from_dict(json.loads(line)) for line in lines]
    assert loaded == history and [r.phase_s for r in loaded] == [r.phase_s for r in history]
    assert json.loads(lines[0])["task_metrics"] == {"accuracy": 0.05, "format_rate": 0.05}
    assert 'data-panel="task:format_rate"' in reporter.report_path.read_text()


@pytest.mark.heavy
@pytest.mark.parametrize("n", [1, 2])
def test_a_run_of_one_or_two_iterations_still_draws_every_chart(n):
    page = render_report(rows(n), status="running")
    assert page.count("<svg") == len(_figures(page)) == len(_keys(rows(n)))


@pytest.mark.heavy
def test_trainer_charts_leave_out_iterations_that_took_no_step_and_the_status_says_so():
    """With no contributing sample the trainer measured nothing: its zeros must not be drawn as a KL or loss of 0."""
    history = rows(5)
    history[2] = replace(history[2], contributing=0, kl=0.0, mean_loss=0.0, clip_frac=0.0, grad_norm=0.0)
    history[4] = replace(history[4], contributing=0, kl=0.0, mean_loss=0.0, clip_frac=0.0, grad_norm=0.0)
    by_key = {p.key: p for p in panels(history)}
    for key in ("loss", "kl", "clip_frac", "grad_norm"):
        assert by_key[key].series[0].x == [0.0, 1.0, 3.0], key
    assert by_key["reward"].series[0].x == [0.0, 1.0, 2.0, 3.0, 4.0]
    status = render_report(history, status="running").split("</p>")[0]
    assert "no step (no group had signal)" in status and "KL" not in status


@pytest.mark.heavy
def test_trainer_charts_are_drawn_empty_before_the_first_step():
    """A run whose groups all had equal rewards so far keeps its loss and KL charts (empty), not a shorter page."""
    history = [replace(row, contributing=0) for row in rows(3)]
    keys = _keys(history)
    assert keys == ["reward", "task:accuracy", *TRAINER_PANELS, "phase_s"]
    page = render_report(history, status="running")
    assert page.count("<svg") == len(keys)


@pytest.mark.heavy
def test_rendering_while_running_stays_under_its_share_of_the_run_and_completion_always_renders(tmp_path, monkeypatch):
    """A render that took 1 s (on a fake clock) holds the next one back 1 / max_render_share = 20 s, whatever the
    interval; completion renders at once. The JSONL is written on every publication regardless."""
    import rl.deploy.file_reporter as report

    clock = [0.0]
    real_render = report.render_report

    def slow_render(*args, **kwargs):  # type: ignore[no-untyped-def]
        clock[0] += 1.0
        return real_render(*args, **kwargs)

    monkeypatch.setattr(report.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(report, "render_report", slow_render)
    reporter = FileReporter(tmp_path, min_interval_s=2.0, max_render_share=0.05)
    renders = []
    for t, status in [(0.0, "running"), (5.0, "running"), (20.5, "running"), (21.5, "running"), (22.0, "complete")]:
        clock[0] = max(clock[0], t)
        asyncio.run(reporter.publish(rows(2), status=status))
        renders.append(reporter.renders)
    assert renders == [1, 1, 1, 2, 3]
    assert len(reporter.metrics_path.read_text().splitlines()) == 2
    with pytest.raises(ValueError, match="max_render_share"):
        FileReporter(tmp_path, max_render_share=0.0)


@pytest.mark.heavy
def test_metrics_file_appends_new_rows_and_rewrites_when_an_earlier_row_changed(tmp_path):
    """Appending keeps the file equal to a full rewrite: after new rows, and after the driver replaced an earlier row
    (an evaluation's seconds added to it), which forces a rewrite."""
    reporter = FileReporter(tmp_path, min_interval_s=3600.0)
    history = rows(5, task=MARKED_TASK)

    def expected(h):  # type: ignore[no-untyped-def]
        return "".join(json.dumps(r.to_dict(), allow_nan=False) + "\n" for r in h)

    asyncio.run(reporter.publish(history[:2], status="running"))
    asyncio.run(reporter.publish(history[:4], status="running"))
    assert reporter.metrics_path.read_text() == expected(history[:4])
    changed = [*history[:1], replace(history[1], phase_s={**history[1].phase_s, "evaluate": 9.5}), *history[2:]]
    asyncio.run(reporter.publish(changed, status="running"))
    assert reporter.metrics_path.read_text() == expected(changed)
    assert json.loads(reporter.metrics_path.read_text().splitlines()[1])["phase_s"]["evaluate"] == 9.5
    asyncio.run(reporter.publish(changed[:3], status="running"))  # a shorter history (a new reporter's view) rewrites
    assert reporter.metrics_path.read_text() == expected(changed[:3])
