"""The device check cut short, on a faked machine: its real pytest run over a fake test folder whose tests finish, fail,
skip, and one that starts a worker in its own session (as torchrun does) and then hangs. The budget "runs out" when that
worker exists (an event, not a clock). After the check returns no process of the run survives, the report lists what
finished as it finished, the hung test as unfinished and the rest as not reached; a worker left behind by a run that
ends on its own is killed as well.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from test_device_check import device_check

HANG_GUARD_S = 120.0  # only bounds a hang: the events below come in seconds

FAKE_TESTS = """
import os, subprocess, sys, time
from pathlib import Path

EVENTS = Path(os.environ["FAKE_EVENTS"])

def _worker_in_its_own_session(name):
    # torchrun's workers: a new session, out of reach of a kill of pytest's process group
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"], start_new_session=True)
    (EVENTS / f"{name}.pids").write_text(f"{os.getpid()} {child.pid}")

def test_a_passes():
    pass

def test_b_fails():
    assert 1 == 2, "planted"

def test_c_skips():
    import pytest
    pytest.skip("needs 2 CUDA GPUs, found 1")

def test_d_leaves_a_worker_behind():
    _worker_in_its_own_session("leaked")

def test_e_hangs_holding_a_worker():
    if os.environ.get("FAKE_HANG"):
        _worker_in_its_own_session("hung")
        time.sleep(3600)

def test_f_never_reached():
    pass
"""


def _alive(pid: int) -> bool:
    """Whether `pid` is a live process (a zombie, killed and awaiting its reaper, is not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def _wait_for(path: Path) -> Any:
    """A waiter for run_selection: the budget runs out once `path` exists (None), or pytest's status if it ends."""

    def wait(proc: subprocess.Popen[bytes], budget_s: float) -> int | None:
        deadline = time.monotonic() + HANG_GUARD_S
        while time.monotonic() < deadline:
            if path.is_file():
                return None
            if proc.poll() is not None:
                return proc.returncode
            time.sleep(0.05)
        raise AssertionError(f"{path} never appeared")

    return wait


def _pids(path: Path) -> list[int]:
    return [int(p) for p in path.read_text().split()]


@pytest.fixture
def fake_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Path, Path]:
    """The check with a faked CUDA and vLLM, running the fake tests instead of gpu_tests/."""
    check = device_check()
    folder, events = tmp_path / "fake_tests", tmp_path / "events"
    folder.mkdir()
    events.mkdir()
    (folder / "test_fake.py").write_text(FAKE_TESTS)
    monkeypatch.setenv("FAKE_EVENTS", str(events))
    monkeypatch.delenv("RL_GPU_REPORT", raising=False)

    def preflight(report: Any) -> None:
        report.driver, report.torch, report.cuda, report.gpus = "580.159.04", "2.11.0+cu130", "13.0", ["H100 (80 GiB)"]

    monkeypatch.setattr(check, "cuda_preflight", preflight)
    monkeypatch.setattr(check, "vllm_tests", lambda env: [])
    monkeypatch.setattr(check, "TESTS", (str(folder), "-p", "no:randomly", "--rootdir", str(folder)))
    return check, events, tmp_path / "out"


def test_a_budget_kill_leaves_no_process_and_reports_what_finished(
    fake_run: tuple[Any, Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    check, events, out = fake_run
    monkeypatch.setenv("FAKE_HANG", "1")
    run = check.run_selection
    monkeypatch.setattr(
        check,
        "run_selection",
        lambda env, work, budget_s: run(env, work, budget_s, check.TESTS, _wait_for(events / "hung.pids")),
    )
    assert check.main(["--out", str(out)]) == 1
    pids = _pids(events / "hung.pids") + _pids(events / "leaked.pids")  # pytest, its hung worker, the leaked one
    assert not [pid for pid in pids if _alive(pid)], [(pid, _alive(pid)) for pid in pids]

    report = json.loads((out / "report.json").read_text())
    outcomes = {t["name"]: (t["outcome"], t["detail"]) for t in report["tests"]}
    assert outcomes == {
        "test_a_passes": ("passed", ""),
        "test_b_fails": ("failed", outcomes["test_b_fails"][1]),
        "test_c_skips": ("skipped", "needs 2 CUDA GPUs, found 1"),
        "test_d_leaves_a_worker_behind": ("passed", ""),
        "test_e_hangs_holding_a_worker": ("unfinished", "killed at the budget while it ran"),
        "test_f_never_reached": ("not reached", "killed at the budget"),
    }
    assert "planted" in outcomes["test_b_fails"][1]
    assert report["pytest_exit"] == 124 and report["left_behind"] >= 3  # pytest, the hung worker, the leaked one
    text = (out / "report.md").read_text()
    assert "FAILED: 3 of 6 selected tests" in text and "cut at the budget" in text
    assert "| test_a_passes | passed |" in text and "| test_f_never_reached | not reached |" in text
    assert not (out / "junit.xml").exists()  # pytest never got to write it; the outcome log stands in
    assert (out / "outcomes.jsonl").is_file()


def test_a_worker_left_behind_by_a_run_that_ends_is_killed(
    fake_run: tuple[Any, Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    check, events, out = fake_run
    assert check.main(["--out", str(out)]) == 1  # test_b fails
    worker = _pids(events / "leaked.pids")[1]
    assert not _alive(worker)
    report = json.loads((out / "report.json").read_text())
    assert report["pytest_exit"] == 1 and report["left_behind"] >= 1
    outcomes = {t["name"]: t["outcome"] for t in report["tests"]}
    assert outcomes["test_e_hangs_holding_a_worker"] == outcomes["test_f_never_reached"] == "passed"
    assert (out / "junit.xml").is_file()


def test_a_sigkilled_run_keeps_finished_outcomes(tmp_path: Path) -> None:
    """The fold alone: a log cut mid-line by the kill, with numbers recorded by the running test."""
    check = device_check()
    log, numbers = tmp_path / "outcomes.jsonl", tmp_path / "numbers.jsonl"
    rows = [
        {"event": "collected", "names": ["t1", "t2", "t3"]},
        {"event": "start", "name": "t1"},
        *({"event": "report", "name": "t1", "when": w, "outcome": "passed", "seconds": 1.0, "detail": ""}
          for w in ("setup", "call", "teardown")),
        {"event": "start", "name": "t2"},
        {"event": "report", "name": "t2", "when": "setup", "outcome": "passed", "seconds": 0.5, "detail": ""},
    ]  # fmt: skip
    log.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"event": "rep')
    numbers.write_text(json.dumps({"test": "t2", "peak_gib": 3.1}) + "\n")
    got = {t.name: (t.outcome, t.numbers) for t in check.read_outcomes(log, numbers, 124)}
    assert got == {"t1": ("passed", {}), "t2": ("unfinished", {"peak_gib": 3.1}), "t3": ("not reached", {})}
