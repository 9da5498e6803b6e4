"""VLLMEngine's start: a KV cache that fits the machine when VLLM_CPU_KVCACHE_SPACE is unset, and a failed start as
one typed line carrying the root cause vLLM's engine process logged (vLLM itself raises only "see root cause above")."""

from __future__ import annotations

import os
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest
from fixtures_real import tiny_model_dir

import rl.samplers.vllm as vllm_engine
from rl.cli import main
from rl.errors import EngineStartError, RlError
from rl.models.opened_model import open_model
from rl.samplers.vllm import KVCACHE_ENV, VLLMEngine
from rl.samplers.vllm_start import cpu_kvcache_gib, start_failure_cause
from rl.storage.artifacts import LocalArtifacts

__all__ = ["tiny_model_dir"]  # a fixture

GIB = 2**30

# What vLLM 0.32's engine core writes to stderr when it dies starting (its processes' lines carry a prefix), then the
# exception the front end raises: the root cause is only in the child's output.
CHILD_LOG = """
import sys
w = sys.stderr.write
w("(EngineCore_DP0 pid=4242) ERROR 12-02 22:00:00 [core.py:866] EngineCore failed to start.\\n")
w("(EngineCore_DP0 pid=4242) Traceback (most recent call last):\\n")
w('(EngineCore_DP0 pid=4242)   File "vllm/v1/worker/cpu_worker.py", line 9, in determine_available_memory\\n')
w("(EngineCore_DP0 pid=4242) \\x1b[0;31mValueError: Available memory on node 0 (3.1/24.0 GiB) on startup is less "
  "than desired CPU memory utilization (0.9, 21.6 GiB).\\x1b[0m\\n")
w("(EngineCore_DP0 pid=4242) Exception: WorkerProc initialization failed. See stack trace for root cause.\\n")
sys.exit(1)
"""
CAUSE = (
    "ValueError: Available memory on node 0 (3.1/24.0 GiB) on startup is less than desired CPU memory utilization "
    "(0.9, 21.6 GiB)."
)
FRONT_END_ERROR = "Engine core initialization failed. See root cause above. Failed core proc(s): {'EngineCore_DP0': 1}"


def fake_vllm(**behaviour: Any) -> types.ModuleType:
    """A `vllm` whose `LLM(...)` records the environment it started in, or fails as the real one does: its engine
    process (a real child process, inheriting stderr) logs the cause and dies, then the front end raises."""
    module = types.ModuleType("fake_vllm")
    seen: dict[str, Any] = {}

    class LLM:
        def __init__(self, **kwargs: Any) -> None:
            seen["kvcache"] = os.environ.get(KVCACHE_ENV)
            if behaviour.get("fail"):
                subprocess.run([sys.executable, "-c", CHILD_LOG], check=False)
                raise RuntimeError(FRONT_END_ERROR)

    module.LLM = LLM  # type: ignore[attr-defined]
    module.seen = seen  # type: ignore[attr-defined]
    return module


def engine(base: Path, tmp_path: Path, module: types.ModuleType) -> VLLMEngine:
    return VLLMEngine(open_model(base, tokenizer=False), LocalArtifacts(tmp_path / "store"), vllm_module=module)


@pytest.mark.parametrize(("available_gib", "expected"), [(0.5, 1), (4, 1), (8, 2), (12.9, 3), (23, 4), (256, 4)])
def test_the_kv_cache_is_a_quarter_of_available_memory_between_1_and_4_gib(available_gib: float, expected: int) -> None:
    assert cpu_kvcache_gib(int(available_gib * GIB)) == expected


def test_an_unset_kvcache_variable_is_sized_from_the_machine_for_the_start_only(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(KVCACHE_ENV, raising=False)
    monkeypatch.setattr(vllm_engine, "available_memory_bytes", lambda: 9 * GIB)
    module = fake_vllm()
    engine(tiny_model_dir, tmp_path, module).llm  # noqa: B018 (starting the engine is the act under test)
    assert module.seen["kvcache"] == "2"
    assert KVCACHE_ENV not in os.environ  # vLLM's processes inherited it; this process's environment is as it was


def test_a_kvcache_the_user_set_is_kept(tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KVCACHE_ENV, "7")
    module = fake_vllm()
    engine(tiny_model_dir, tmp_path, module).llm  # noqa: B018
    assert module.seen["kvcache"] == "7"


def test_the_root_cause_is_the_first_specific_exception_line_of_vllms_processes() -> None:
    log = subprocess.run([sys.executable, "-c", CHILD_LOG], capture_output=True, text=True, check=False).stderr
    assert start_failure_cause(log) == CAUSE
    wrapper_only = "(EngineCore_DP0 pid=1) Exception: WorkerProc initialization failed. See stack trace for root cause."
    assert start_failure_cause(wrapper_only) == wrapper_only.partition(") ")[2]
    assert start_failure_cause("INFO nothing went wrong here\nWARNING a ValueError was mentioned\n") is None


def test_a_failed_start_is_one_typed_line_with_the_engine_processes_root_cause(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv(KVCACHE_ENV, raising=False)
    monkeypatch.setattr(vllm_engine, "available_memory_bytes", lambda: 6 * GIB)
    failing = engine(tiny_model_dir, tmp_path, fake_vllm(fail=True))
    with pytest.raises(EngineStartError) as raised:
        failing.llm  # noqa: B018
    message = str(raised.value)
    assert "\n" not in message
    assert f"root cause: {CAUSE}" in message
    assert "RuntimeError: Engine core initialization failed" in message
    assert f"{KVCACHE_ENV}=1 GiB (chosen by the engine, 6.0 GiB available)" in message
    assert isinstance(raised.value, RlError) and raised.value.exit_code == 9
    assert failing._scratch is None and failing._llm is None  # its scratch directory went with it
    os.write(2, b"after the start\n")  # stderr is this process's own again, and the child's lines reached it
    err = capfd.readouterr().err
    assert CAUSE in err and err.rstrip().endswith("after the start")


def test_the_rl_command_ends_a_failed_start_with_one_line_and_the_rl_error_status(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """What a user of `rl demo grpo --engine vllm` sees: the same line and exit 9, not vLLM's exit-70 traceback."""
    import rl.commands.demo as demo_command

    def start(args: Any) -> int:
        engine(tiny_model_dir, tmp_path, fake_vllm(fail=True)).llm  # noqa: B018
        return 0

    monkeypatch.setattr(demo_command, "run_grpo_demo", start)
    assert main(["demo", "grpo", "--out", str(tmp_path / "run")]) == 9
    err = capsys.readouterr().err
    assert [line for line in err.splitlines() if f"root cause: {CAUSE}" in line]
