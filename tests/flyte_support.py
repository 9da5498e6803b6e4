"""Running tasks in Flyte's local mode from a test, isolated from every other test.

Imported by the `flyte`-marked tests (`from flyte_support import ...`: pytest puts tests/ on sys.path).

What needs isolating, as measured on flyte 2.12.1:
- the task cache lives in `~/.flyte/local-cache`, behind one SQLite connection per *process*: a test gets its own
  `HOME`, and the connection is closed before and after it so the next run opens the cache under the new `HOME`;
- the checkpoint paths are `<raw_data_path>/checkpoint` and `<raw_data_path>/prev_checkpoint` for the whole run, so a
  test gets its own `raw_data_path`;
- each run's metadata (inputs, outputs, `report.html`) goes to `/tmp/flyte/metadata/<run name>`; it is removed after
  the test;
- every download and upload leaves an empty `flyte-tmp-*` directory in the temp directory (`flyte.storage`'s
  `get_random_local_path` never removes its `mkdtemp`): a test gets its own temp directory, removed with `tmp_path`.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import flyte
import pytest

METADATA_ROOT = Path("/tmp/flyte/metadata")  # where flyte 2.12 local mode writes each run's metadata (not configurable)


def reset_local_cache_connection() -> None:
    """Close flyte's process-wide local cache connection, so the next run reopens it under the current HOME."""
    from flyte._persistence._db import LocalDB  # private: flyte offers no public way to re-point the local cache

    asyncio.run(LocalDB.close())


@dataclass
class LocalRun:
    output: Any
    metadata_dir: Path

    def report_html(self) -> str:
        """The one report of the run (only the driver sets `report=True`)."""
        reports = sorted(self.metadata_dir.glob("*/report.html"))
        assert len(reports) == 1, f"expected one report.html under {self.metadata_dir}, found {reports}"
        return reports[0].read_text()


@dataclass
class LocalFlyte:
    """Runs tasks in local mode with this test's own raw-data path."""

    root: Path
    runs: list[Path] = field(default_factory=list)

    @property
    def raw_data_path(self) -> Path:
        return self.root / "raw"

    def run(self, task: Any, *, disable_run_cache: bool = False, **inputs: Any) -> LocalRun:
        name = f"rl-test-{uuid.uuid4().hex[:16]}"  # named up front, so a run that fails is cleaned up too
        self.runs.append(METADATA_ROOT / name)
        runner = flyte.with_runcontext(
            mode="local", name=name, raw_data_path=str(self.raw_data_path), disable_run_cache=disable_run_cache
        )
        run = runner.run(task, **inputs)
        outputs = run.outputs()
        return LocalRun(outputs[0] if len(outputs) == 1 else tuple(outputs), Path(run.url))

    def cleanup(self) -> None:
        for path in self.runs:
            shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def isolated_flyte(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalFlyte]:
    """A `LocalFlyte` with its own HOME (task cache) and raw-data path (checkpoint, Dirs); wrap it in a fixture."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    reset_local_cache_connection()
    local = LocalFlyte(tmp_path)
    try:
        yield local
    finally:
        reset_local_cache_connection()
        local.cleanup()
