"""The GRPO demo on the real CPU stack: files a person reads, a JSON summary a script reads, resumable."""

from __future__ import annotations

import json
import re

import pytest

from rl.cli import main
from rl.types import IterationMetrics


@pytest.mark.heavy
def test_demo_writes_metrics_jsonl_report_html_and_a_json_summary(tmp_path, capsys):
    """`rl demo grpo --json`: one IterationMetrics per line, a report with charts, the summary's public keys."""
    out = tmp_path / "demo"
    assert (
        main(["demo", "grpo", "--iterations", "3", "--prompts", "2", "--samples", "2", "--out", str(out), "--json"])
        == 0
    )
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for key in ("accuracy_first", "accuracy_last", "constant_baseline_accuracy", "iterations", "wall_s"):
        assert key in summary
    assert summary["iterations"] == 3 and summary["constant_baseline_accuracy"] == pytest.approx(0.1)
    rows = [IterationMetrics.from_dict(json.loads(line)) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r.iteration for r in rows] == [0, 1, 2]
    assert all(set(r.task_metrics) == {"accuracy"} for r in rows)  # the digit task has no answer format to rate
    assert all(set(r.phase_s) >= {"generate", "score", "train"} for r in rows)
    page = (out / "report.html").read_text()
    assert "status: <b>complete</b>" in page and "Recent samples" in page
    assert re.findall(r'<figure class="panel" data-panel="([^"]+)">', page) == [
        "reward",
        "task:accuracy",
        *("loss", "kl", "clip_frac", "grad_norm", "no_signal", "completion_tokens", "phase_s"),
    ]
    assert page.count("<svg") == 9 and "format rate" not in page


@pytest.mark.heavy
def test_demo_resumes_a_finished_run_without_training_again(tmp_path, capsys):
    """A second `rl demo grpo` in the same directory resumes from its checkpoint instead of starting over."""
    args = ["demo", "grpo", "--iterations", "2", "--prompts", "2", "--samples", "2", "--out", str(tmp_path), "--json"]
    assert main(args) == 0
    first = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert main(args) == 0
    second = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert first["resumed_from"] == -1 and second["resumed_from"] == 1
    assert second["accuracy_last"] == first["accuracy_last"]


@pytest.mark.heavy
def test_demo_refuses_to_resume_a_run_of_another_configuration_and_says_what_to_do(tmp_path, capsys):
    """A different --samples in the same --out is a clear error (exit 3, `CheckpointError`'s family), not a
    traceback or a silent restart."""
    base = ["demo", "grpo", "--iterations", "1", "--prompts", "2", "--out", str(tmp_path)]
    assert main([*base, "--samples", "2"]) == 0
    capsys.readouterr()
    assert main([*base, "--samples", "4"]) == 3
    err = capsys.readouterr().err
    assert "cannot resume" in err and "--fresh" in err
