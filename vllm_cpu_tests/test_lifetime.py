"""An engine's lifetime: `close` ends vLLM's engine-core process and removes what the engine wrote to disk.

These close the session's shared engine, so they run last (`lifetime` marker, conftest.py). That nothing is left in
the session's TMPDIR afterwards is checked by `nox -s vllm-cpu` itself, after pytest exits.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psutil
import pytest
from vllm_cpu_helpers import generate, request

pytestmark = pytest.mark.lifetime


def test_close_ends_the_engine_core_process_and_removes_the_adapter_copies(engine: Any, adapters: Any) -> None:
    """The warm engine has an engine-core process (a child of this one) and adapter copies on disk; after `close`
    the process has exited and the copies are gone."""
    generate(engine, request(adapters["a"][0], seed=1))
    # vLLM names its processes (setproctitle): VLLM::EngineCore and its VLLM::Worker. multiprocessing's resource
    # tracker, also a child, lives until this interpreter exits, as it should.
    children = [p for p in psutil.Process().children(recursive=True) if p.name().startswith("VLLM::")]
    assert {p.name() for p in children} >= {"VLLM::EngineCore"}, "no engine-core process is running"
    written = engine.adapter_root
    assert any(written.iterdir())
    scratch = Path(engine._scratch.name)  # vLLM's socket files and inductor cache
    assert any(scratch.iterdir())
    engine.close()
    # A bound on waiting, not a speed target: a process that has not exited after a minute is not exiting.
    _, alive = psutil.wait_procs(children, timeout=60)
    assert not alive, f"still running after close: {[(p.pid, p.name()) for p in alive]}"
    assert not written.exists(), f"close left the adapter copies in {written}"
    assert not scratch.exists(), f"close left vLLM's files in {scratch}"
