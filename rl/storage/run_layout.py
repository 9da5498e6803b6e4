"""What a run directory holds, which of it this tool wrote, and the checks before writing into or deleting from one.

`rl demo grpo --out DIR` writes the entries below and nothing else. A directory it creates (or finds empty) gets a
marker file, `.rl-run`; `--fresh` deletes only in a marked directory and only these entries, so `--out .`, `--out ~`
or a folder of someone's files is refused instead of emptied. A run directory may also come from someone else, so
before use every entry is checked not to be a symlink: the checkpoint, report and stores are written through, and a
link would carry those writes (and `--fresh`'s deletes) outside the directory.
"""

from __future__ import annotations

import os
import re
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from rl.errors import FreshRefusedError, UnsafeRunDirError, shown
from rl.storage.run_lock import LOCK_FILES
from rl.storage.safe_fs import Tree

MARKER = ".rl-run"
MARKER_TEXT = "This directory was created by `rl demo grpo`; `--fresh` deletes only the entries it wrote here.\n"


@dataclass(frozen=True)
class RunLayout:
    """Where each entry of a run directory lives: the one place their names are written.

    `rl demo grpo` (`rl.deploy.local`) writes these, `rl rescore` reads them, `--fresh` deletes only what
    `written_by_run` recognises, and `require_safe` checks exactly those names for links.
    """

    root: Path

    CHECKPOINT: ClassVar[str] = "checkpoint.json"
    METRICS: ClassVar[str] = "metrics.jsonl"
    REPORT: ClassVar[str] = "report.html"
    ARTIFACTS: ClassVar[str] = "artifacts"
    VOLUMES: ClassVar[str] = "volumes"

    @property
    def checkpoint(self) -> Path:
        return self.root / self.CHECKPOINT

    @property
    def metrics(self) -> Path:
        return self.root / self.METRICS

    @property
    def report(self) -> Path:
        return self.root / self.REPORT

    @property
    def artifacts(self) -> Path:
        return self.root / self.ARTIFACTS

    @property
    def volumes(self) -> Path:
        """The run's rollout buffer's volume store."""
        return self.root / self.VOLUMES

    def base_model(self, config_digest: str) -> Path:
        """The tiny base model built from the model configuration of digest `config_digest` (its first 12 digits)."""
        return self.root / f"base-{config_digest[:12]}"

    def base_models(self) -> list[str]:
        """The names of the base-model directories present (a run trains one; another `--engine`'s may sit beside)."""
        return sorted(p.name for p in self.root.glob("base-*") if p.is_dir())

    @staticmethod
    def base_staging(base: Path) -> Path:
        """A fresh name to build `base` under before it is published by one rename."""
        return base.parent / f".{base.name}.staging-{uuid.uuid4().hex}"

    @staticmethod
    def is_base_staging(name: str) -> bool:
        """Whether `name` is a base model's staging directory (`base_staging`)."""
        return bool(_BASE_STAGING.fullmatch(name))


_BASE = re.compile(r"base-[0-9a-f]{12}")
_BASE_STAGING = re.compile(rf"\.{_BASE.pattern}\.staging-[0-9a-f]{{32}}")
# Written by the run: checkpoint, report, stores, the base model; and the temp names of a writer killed mid-write
# (the base model's staging directory, the checkpoint's `.checkpoint.json.XXXXXXXX`:
# `rl.storage.checkpoint.file_store`).
_ENTRY = re.compile(
    "|".join(
        [
            *(re.escape(n) for n in (RunLayout.CHECKPOINT, RunLayout.METRICS, RunLayout.REPORT)),
            *(re.escape(n) for n in (RunLayout.ARTIFACTS, RunLayout.VOLUMES)),
            _BASE.pattern,
            _BASE_STAGING.pattern,
            rf"\.{re.escape(RunLayout.CHECKPOINT)}\.[A-Za-z0-9_]{{8}}",
        ]
    )
)


def written_by_run(name: str) -> bool:
    """Whether a run writes an entry called `name` at a run directory's top level (one `RunLayout` names)."""
    return bool(_ENTRY.fullmatch(name))


def claim(run_dir: Path) -> None:
    """Create `run_dir` if absent and mark it as a run directory; an existing one is marked only if it is empty."""
    run_dir.mkdir(parents=True, exist_ok=True)
    if not _entries(run_dir):
        with Tree(run_dir).open_file(run_dir / MARKER, "w") as f:  # never through a link planted at that name
            f.write(MARKER_TEXT)


def _entries(run_dir: Path) -> list[str]:
    """The directory's entries, but the writer's lock files (the lock this process holds on it: deleting its file would
    let a third process lock a new one beside ours)."""
    return sorted(name for name in os.listdir(run_dir) if name not in LOCK_FILES)


def require_safe(run_dir: Path) -> None:
    """Raise UnsafeRunDirError if an entry the run reads or writes is a symlink (it would lead outside `run_dir`)."""
    if not run_dir.is_dir():
        return
    for name in sorted(os.listdir(run_dir)):
        path = run_dir / name
        if (name == MARKER or written_by_run(name)) and path.is_symlink():
            raise UnsafeRunDirError(
                f"{shown(path)} is a symlink (to {shown(os.readlink(path))}), so the run would read or write outside "
                f"{shown(run_dir)}; a run directory someone sent you may be crafted. Remove the link, or use another "
                "--out"
            )


def check_fresh(run_dir: Path) -> None:
    """Raise FreshRefusedError unless `--fresh` may delete in `run_dir`: absent, empty, or marked by this tool.

    Touches nothing, so a caller checks before it takes the run's lock (whose files would land in a refused folder)."""
    if not os.path.lexists(run_dir):
        return
    if not run_dir.is_dir():
        raise FreshRefusedError(
            f"--fresh: {run_dir} is not a directory, so it is not a run to start over; pass another --out"
        )
    names = _entries(run_dir)
    marker = run_dir / MARKER
    if names and (marker.is_symlink() or not marker.is_file()):
        raise FreshRefusedError(
            f"--fresh refuses to delete anything in {run_dir}: this tool did not create it (no {MARKER} marker), so "
            f"its {len(names)} entries may be someone's files; pass an --out of its own, or delete it yourself"
        )


def start_fresh(run_dir: Path) -> list[str]:
    """`--fresh`: delete the entries a run wrote in `run_dir`, if this tool created it; returns the names deleted.

    Anything else in the directory stays. A directory without the marker is refused unless it is empty.
    """
    if not os.path.lexists(run_dir):
        return []
    check_fresh(run_dir)
    names = _entries(run_dir)
    fs = Tree(run_dir)
    deleted = []
    for name in names:
        if written_by_run(name):
            fs.rmtree(run_dir / name)  # unlinks a symlink rather than following it, at any depth
            deleted.append(name)
    return deleted
