"""A pytest plugin (`-p outcome_log`, gpu_tests/ on the path) that appends each test's progress to the JSON-lines file
named by RL_GPU_OUTCOMES as it happens, one flushed line per event, so a run killed mid-test still shows what finished.

Events: {"event": "collected", "names": [...]} once, the selected tests; {"event": "start", "name"} when a test starts;
{"event": "report", "name", "when", "outcome", "seconds", "detail"} for each phase (setup, call, teardown).
`device_check.read_outcomes` folds them into one outcome per test: a test started but never finished was killed.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

ENV = "RL_GPU_OUTCOMES"


def _name(nodeid: str) -> str:
    return nodeid.split("::")[-1]  # junit.xml's "name", and the key `gpu_report` records numbers under


def _append(event: dict[str, Any]) -> None:
    path = os.environ.get(ENV)
    if not path:
        return
    with open(path, "a", encoding="utf-8") as f:  # closed at once: the line is the kernel's even if pytest is killed
        f.write(json.dumps(event, default=str) + "\n")


def _detail(report: pytest.TestReport) -> str:
    if report.passed:
        return ""
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:  # a skip: (path, line, reason)
        return str(longrepr[2]).removeprefix("Skipped: ")
    crash = getattr(longrepr, "reprcrash", None)
    text = crash.message if crash is not None else str(longrepr or "")
    return text.strip().splitlines()[0] if text.strip() else ""


def pytest_collection_finish(session: pytest.Session) -> None:
    _append({"event": "collected", "names": [_name(item.nodeid) for item in session.items]})


def pytest_runtest_logstart(nodeid: str, location: tuple[str, int | None, str]) -> None:
    _append({"event": "start", "name": _name(nodeid)})


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _append(
        {
            "event": "report",
            "name": _name(report.nodeid),
            "when": report.when,
            "outcome": report.outcome,
            "seconds": round(report.duration, 3),
            "detail": _detail(report),
        }
    )
