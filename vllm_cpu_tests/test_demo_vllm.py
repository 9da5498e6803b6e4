"""`rl demo grpo --engine vllm`: the GRPO loop end to end on real vLLM (its CPU build), small sizes.

Each run is its own process (the CLI as a user runs it), each starting its own vLLM engine core, so this module costs
three engine start-ups: the uninterrupted run (which the learning test reads), and the killed run's two lives. The
kill lands whenever the run has checkpointed an iteration; what must hold does not depend on when.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from fakes.process_kills import RL, final_state_differences

ITERATIONS = 20


def _demo(out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-c", RL, "demo", "grpo", "--engine", "vllm", "--out", str(out), *extra]


def _run(command: list[str]) -> dict:
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[str], Path, dict]:
    """One uninterrupted run, 20 iterations of 8 prompts x 8 samples: (its command, its directory moved aside, its
    summary). Its command writes `run/` beside `reference/`: the run directory's path is part of its artifact URIs,
    so a second run of the same command can be compared with it byte for byte."""
    root = tmp_path_factory.mktemp("demo-vllm")
    command = _demo(root / "run", "--iterations", str(ITERATIONS), "--json")
    summary = _run(command)
    (root / "run").rename(root / "reference")
    return command, root, summary


def test_the_demo_learns_above_the_best_constant_answer_with_vllm(reference: tuple[list[str], Path, dict]) -> None:
    """Rollouts from real vLLM: the last tenth's training accuracy beats always answering the most common digit, and
    the report and metrics are written as with the torch sampler."""
    _, root, summary = reference
    print(f"--engine vllm, {ITERATIONS} iterations: {summary}")
    assert summary["engine"] == "vllm" and summary["iterations"] == ITERATIONS
    assert summary["accuracy_last"] > summary["constant_baseline_accuracy"], summary
    assert (root / "reference" / "report.html").is_file()
    assert len((root / "reference" / "metrics.jsonl").read_text().splitlines()) == ITERATIONS


def test_a_killed_vllm_demo_resumes_to_the_uninterrupted_runs_end(reference: tuple[list[str], Path, dict]) -> None:
    """SIGKILL the demo (and its engine core) once it has checkpointed an iteration, run it again: it resumes and
    ends with the uninterrupted run's adapter, optimizer, checkpoint and metrics, byte for byte (timings aside)."""
    command, root, _ = reference
    run = root / "run"
    # A SIGKILLed process cannot remove its temporary files (adapter copies, vLLM's sockets and rendezvous file), as
    # a lost node's /tmp goes with the node: this one gets a TMPDIR of its own, removed below. A short one: vLLM's
    # socket paths (TMPDIR/rl-vllm-scratch-*/<uuid>) must fit a Unix socket's 107 bytes, and the test's own
    # directory (under pytest's basetemp) is too deep for that.
    killed_tmp = Path(tempfile.mkdtemp(prefix="rlk-"))
    env = {**os.environ, "TMPDIR": str(killed_tmp)}
    process = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True, env=env
    )
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
        shutil.rmtree(killed_tmp, ignore_errors=True)
    summary = _run(command)
    assert summary["resumed_from"] is not None and summary["resumed_from"] >= 1, summary
    assert final_state_differences(root / "reference", run, ITERATIONS) == []


def _checkpointed(run: Path) -> bool:
    try:
        return json.loads((run / "checkpoint.json").read_text())["state"]["iteration"] >= 1
    except (OSError, ValueError, KeyError, TypeError):
        return False
