"""A driver checkpoint on the local filesystem (the `flyte.ctx().checkpoint` role outside Flyte)."""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

from rl.dead_writers import discard_if_dead, lock_fd


class FileStateStore:
    """One file, replaced atomically: a crash mid-write leaves the previous checkpoint, never half of a new one.

    The new checkpoint is written to `.<name>.XXXXXXXX` beside it, locked while written (`rl.dead_writers`), so the temp
    file a killed writer left is found and deleted by `discard_abandoned` at the next start.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path).absolute()

    async def load(self) -> bytes | None:
        try:
            return self.path.read_bytes()
        except FileNotFoundError:
            return None

    async def save(self, data: bytes) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            fd, tmp = tempfile.mkstemp(prefix=self._temp_prefix, dir=self.path.parent)
            if lock_fd(fd, Path(tmp)):
                break
            os.close(fd)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
                os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def discard_abandoned(self) -> list[Path]:
        """Delete the temp files of writers that died mid-save (none a live writer holds); returns what went."""
        pattern = re.compile(re.escape(self._temp_prefix) + r"[A-Za-z0-9_]{8}")
        try:
            names = sorted(os.listdir(self.path.parent))
        except FileNotFoundError:
            return []
        found = [self.path.parent / n for n in names if pattern.fullmatch(n)]
        return [p for p in found if discard_if_dead(p)]

    @property
    def _temp_prefix(self) -> str:
        return f".{self.path.name}."
