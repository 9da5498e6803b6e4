"""Kill points arm only the named module's calls and kill exactly at the Nth (in a child process)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from fakes.kill_points import POINTS

CHILD = """
import os, sys
from pathlib import Path
from fakes.kill_points import POINTS, arm
arm(POINTS["checkpoint"], int(sys.argv[1]), Path(sys.argv[2]))
import asyncio
from rl.storage.checkpoint.file_store import FileCheckpointStore
store = FileCheckpointStore(Path(sys.argv[3]) / "checkpoint.json")
os.replace(sys.argv[2] + ".x", sys.argv[2] + ".y") if os.path.exists(sys.argv[2] + ".x") else None  # not counted
for i in range(3):
    asyncio.run(store.save(str(i).encode()))
print("done")
"""


def _child(nth: int, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    (tmp_path / "count.x").write_text("")
    return subprocess.run(
        [sys.executable, "-c", CHILD, str(nth), str(tmp_path / "count"), str(tmp_path)],
        capture_output=True,
        text=True,
        check=False,
    )


def test_counting_mode_counts_only_the_points_own_calls(tmp_path: Path) -> None:
    result = _child(0, tmp_path)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "count").read_text() == "3"  # three saves; the os.replace from this script is not counted


@pytest.mark.parametrize("nth", [1, 3])
def test_the_process_dies_at_the_nth_call_before_its_effect(tmp_path: Path, nth: int) -> None:
    result = _child(nth, tmp_path)
    assert result.returncode == -9 and "done" not in result.stdout
    checkpoint = tmp_path / "checkpoint.json"
    # Killed before the nth replace: the checkpoint holds save nth-1's bytes (none before the first).
    assert (checkpoint.read_bytes() if checkpoint.exists() else None) == (str(nth - 2).encode() if nth > 1 else None)


def test_every_point_names_a_module_and_an_os_call() -> None:
    import os

    for name, point in POINTS.items():
        assert (Path(__file__).parents[1] / point.module_file).is_file(), name
        assert callable(getattr(os, point.call)), name
