"""The private staging a model load makes (`rl.models.opened_model.ModelDir.staged`) does not outlive its process: a
load killed mid-way (SIGKILL) leaves one behind, which the next load removes; a live process's stays."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from fixtures_real import tiny_model_dir

from rl.models.model_files import STAGE_PREFIX
from rl.models.opened_model import open_model

__all__ = ["tiny_model_dir"]  # a fixture

HOLD = """
import sys
from pathlib import Path
from rl.models.opened_model import open_model
with open_model(Path(sys.argv[1])) as model, model.staged() as stage:
    print(stage, flush=True)
    sys.stdin.read()  # held until the test kills it or closes stdin
"""


def _holder(model: Path) -> tuple[subprocess.Popen[str], Path]:
    child = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(model)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None
    return child, Path(child.stdout.readline().strip())


@pytest.mark.heavy  # two processes that import torch
def test_a_killed_loads_staging_is_removed_by_the_next_a_live_ones_kept(tiny_model_dir: Path) -> None:
    killed, left = _holder(tiny_model_dir)
    live, kept = _holder(tiny_model_dir)
    try:
        assert left.name.startswith(STAGE_PREFIX) and left.parent == Path(tempfile.gettempdir())
        os.kill(killed.pid, signal.SIGKILL)
        killed.wait(timeout=60)
        assert left.is_dir()  # what a SIGKILL leaves
        with open_model(tiny_model_dir) as model, model.staged() as stage:
            assert stage.is_dir() and (stage / "config.json").is_file()
        assert not stage.exists() and not left.exists() and kept.is_dir()
    finally:
        assert live.stdin is not None
        live.stdin.close()
        live.wait(timeout=60)
        killed.kill()
    assert not kept.exists()  # its own block removed it
