"""A driver checkpoint on the local filesystem (the `flyte.ctx().checkpoint` role outside Flyte)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


class FileStateStore:
    """One file, replaced atomically: a crash mid-write leaves the previous checkpoint, never half of a new one."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path).absolute()

    async def load(self) -> bytes | None:
        try:
            return self.path.read_bytes()
        except FileNotFoundError:
            return None

    async def save(self, data: bytes) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=self.path.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
