"""Real-process kill chaos compares final run directories bit for bit: the comparison catches what it exists for."""

from __future__ import annotations

import json
from pathlib import Path

from fakes.process_kills import demo_command, final_state_differences


def _run_dir(root: Path, *, adapter: bytes = b"A", rows: int = 2, loss: float = 0.5, phase_s: float = 1.0) -> Path:
    root.mkdir(parents=True)
    for ref, digest, name, data in (
        ("adapter-v2", "aa", "adapter_model.safetensors", adapter),
        ("optimizer-v2", "bb", "optimizer.pt", b"O"),
    ):
        (root / "artifacts" / "refs").mkdir(parents=True, exist_ok=True)
        (root / "artifacts" / "refs" / ref).write_text(f"sha256:{digest}")
        (root / "artifacts" / "objects" / digest).mkdir(parents=True)
        (root / "artifacts" / "objects" / digest / name).write_bytes(data)
    history = [{"iteration": i, "mean_loss": loss, "phase_s": {"train": phase_s}} for i in range(rows)]
    (root / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in history))
    checkpoint = {"schema": 1, "digest": f"d{phase_s}", "state": {"iteration": rows - 1, "history": history}}
    (root / "checkpoint.json").write_text(json.dumps(checkpoint))
    return root


def test_equal_runs_compare_equal_whatever_their_wall_clock_timings(tmp_path):
    reference = _run_dir(tmp_path / "ref")
    assert final_state_differences(reference, _run_dir(tmp_path / "run", phase_s=9.0), 2) == []


def test_a_changed_adapter_byte_a_repeated_metrics_row_or_a_changed_loss_is_reported(tmp_path):
    reference = _run_dir(tmp_path / "ref")
    assert final_state_differences(reference, _run_dir(tmp_path / "a", adapter=b"B"), 2) == [
        "adapter-v2 differs from the uninterrupted run's, byte for byte"
    ]
    twice = _run_dir(tmp_path / "b")
    with (twice / "metrics.jsonl").open("a") as f:
        f.write(json.dumps({"iteration": 1, "mean_loss": 0.5, "phase_s": {}}) + "\n")
    assert final_state_differences(reference, twice, 2) == [
        "metrics.jsonl differs from the uninterrupted run's (iterations [0, 1, 1])"
    ]
    found = final_state_differences(reference, _run_dir(tmp_path / "c", loss=0.25), 2)
    assert found == [
        "checkpoint.json differs from the uninterrupted run's",
        "metrics.jsonl differs from the uninterrupted run's (iterations [0, 1])",
    ]


def test_a_missing_final_artifact_is_reported(tmp_path):
    reference = _run_dir(tmp_path / "ref")
    run = _run_dir(tmp_path / "run")
    (run / "artifacts" / "refs" / "optimizer-v2").unlink()
    assert final_state_differences(reference, run, 2) == ["the killed run has no optimizer-v2"]


def test_the_killed_command_is_the_demo_resumed_in_the_same_directory(tmp_path):
    command = demo_command(tmp_path / "run", 3, pipelined=True)
    assert command[3:] == ["demo", "grpo", "--iterations", "3", "--out", str(tmp_path / "run"), "--pipelined"]
