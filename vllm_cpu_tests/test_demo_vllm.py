"""`rl demo grpo --engine vllm`: the GRPO loop end to end on real vLLM (its CPU build), small sizes.

Each run is its own process (the CLI as a user runs it), each starting its own vLLM engine core, so this module costs
three engine start-ups: the learning run, and the killed run's two lives. The kill lands whenever the run has
checkpointed an iteration; what must hold does not depend on when.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from fakes.process_kills import RL, final_state_differences

ITERATIONS = 12
SIZES = ("--prompts", "4", "--samples", "4")


def _demo(out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-c", RL, "demo", "grpo", "--engine", "vllm", "--out", str(out), *SIZES, *extra]


def _run(command: list[str]) -> dict:
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_demo_learns_above_the_best_constant_answer_with_vllm(tmp_path: Path) -> None:
    """40 iterations of 8 prompts x 8 samples, rollouts from real vLLM: the last tenth's training accuracy beats
    always answering the most common digit, and the report and metrics are written as with the torch sampler."""
    summary = _run(_demo(tmp_path / "run", "--iterations", "40", "--prompts", "8", "--samples", "8", "--json"))
    print(f"--engine vllm, 40 iterations: {summary}")
    assert summary["engine"] == "vllm" and summary["iterations"] == 40
    assert summary["accuracy_last"] > summary["constant_baseline_accuracy"], summary
    assert Path(summary["report"]).is_file() and len(Path(summary["metrics"]).read_text().splitlines()) == 40


def test_a_killed_vllm_demo_resumes_to_the_uninterrupted_runs_end(tmp_path: Path) -> None:
    """SIGKILL the demo (and its engine core) once it has checkpointed an iteration, run it again: it resumes and
    ends with the uninterrupted run's adapter, optimizer, checkpoint and metrics, byte for byte (timings aside)."""
    run, reference = tmp_path / "run", tmp_path / "reference"
    command = _demo(run, "--iterations", str(ITERATIONS), "--json")
    _run(command)
    run.rename(reference)  # the run directory's path is part of its artifact URIs: both runs use the same one
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        while process.poll() is None and not _checkpointed(run):
            time.sleep(0.05)
        assert process.poll() is None, "the run ended before it could be killed: " + process.stderr.read().decode()
        family = [psutil.Process(process.pid), *psutil.Process(process.pid).children(recursive=True)]
        os.killpg(process.pid, signal.SIGKILL)  # the demo and its engine core, as a node loss would
        process.wait()
        psutil.wait_procs(family, timeout=60)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        process.stderr.close()  # type: ignore[union-attr]
    summary = _run(command)
    assert summary["resumed_from"] is not None and summary["resumed_from"] >= 1, summary
    assert final_state_differences(reference, run, ITERATIONS) == []


def _checkpointed(run: Path) -> bool:
    try:
        return json.loads((run / "checkpoint.json").read_text())["state"]["iteration"] >= 1
    except (OSError, ValueError, KeyError, TypeError):
        return False
