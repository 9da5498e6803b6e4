"""`nox -s gpu` installs uv.lock as locked (`uv sync --locked`), not a fresh resolution of `.[gpu]`: the noxfile's
session is run against a stand-in for nox that records what it would run. (`nox -s vllm-api` checks with
`uv lock --check` that the lock is current.)"""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent


class RecordingSession:
    """What `gpu` calls on a `nox.Session`; it refuses a call it does not expect, so an unlocked install shows."""

    posargs: list[str] = []  # noqa: RUF012
    venv_backend = "uv"

    def __init__(self) -> None:
        self.virtualenv = types.SimpleNamespace(location="/venvs/gpu")
        self.installs: list[tuple[tuple[str, ...], dict[str, Any]]] = []
        self.runs: list[tuple[str, ...]] = []

    def run_install(self, *args: str, **kwargs: Any) -> None:
        self.installs.append((args, kwargs))

    def install(self, *args: str, **kwargs: Any) -> None:
        self.installs.append((("pip-install", *args), kwargs))

    def run(self, *args: str, **kwargs: Any) -> None:
        self.runs.append(args)


def _fake_nox() -> types.ModuleType:
    nox = types.ModuleType("nox")

    def session(*args: Any, **kwargs: Any) -> Any:
        return args[0] if args and callable(args[0]) else (lambda fn: fn)

    nox.session = session  # type: ignore[attr-defined]
    nox.parametrize = lambda *a, **k: lambda fn: fn  # type: ignore[attr-defined]
    nox.options = types.SimpleNamespace()  # type: ignore[attr-defined]
    nox.Session = RecordingSession  # type: ignore[attr-defined]
    return nox


@pytest.fixture
def noxfile(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    monkeypatch.setitem(sys.modules, "nox", _fake_nox())
    monkeypatch.chdir(REPO)
    spec = importlib.util.spec_from_file_location("noxfile_under_test", REPO / "noxfile.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_gpu_session_installs_uv_lock_as_locked(noxfile: types.ModuleType) -> None:
    session = RecordingSession()
    noxfile.gpu(session)
    assert len(session.installs) == 1, session.installs
    args, kwargs = session.installs[0]
    assert args[:3] == ("uv", "sync", "--locked") and args[3:5] == ("--extra", "gpu")
    assert kwargs["env"] == {"UV_PROJECT_ENVIRONMENT": "/venvs/gpu"}  # into the session's venv, not ./.venv
    assert session.runs and session.runs[0][:2] == ("pytest", "gpu_tests")
