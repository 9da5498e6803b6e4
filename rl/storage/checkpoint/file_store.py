"""A driver checkpoint on the local filesystem (the `flyte.ctx().checkpoint` role outside Flyte)."""

from __future__ import annotations

import contextlib
import os
import re
import uuid
from pathlib import Path

from rl.storage.dead_writers import discard_if_dead, lock_at
from rl.storage.safe_fs import Tree, create_at

# A checkpoint holds a run's history and evaluations: megabytes for a long run, never this.
MAX_CHECKPOINT_BYTES = 256 << 20


class FileCheckpointStore:
    """One file, replaced atomically: a crash mid-write leaves the previous checkpoint, never half of a new one.

    The new checkpoint is written to `.<name>.XXXXXXXX` beside it, locked while written (`rl.storage.dead_writers`), so
    the temp file a killed writer left is found and deleted by `discard_abandoned` at the next start. The file and its
    temp files are opened without following links (`rl.storage.safe_fs`): a symlink planted there is refused, never
    written through.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(os.path.abspath(path))
        self.fs = Tree(self.path.parent)

    async def load(self) -> bytes | None:
        try:
            return self.fs.read_bytes(self.path, limit=MAX_CHECKPOINT_BYTES)
        except FileNotFoundError:
            return None
        except OverflowError:
            from rl.errors import CheckpointCorruptError

            raise CheckpointCorruptError(
                f"{self.path} is larger than {MAX_CHECKPOINT_BYTES} bytes, more than any checkpoint this tool writes; "
                "delete it to restart the run from iteration 0, or restore the previous checkpoint"
            ) from None

    async def save(self, data: bytes) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.fs.directory(self.path.parent) as dfd:  # held: each step below is one call by name
            while True:
                tmp = f"{self._temp_prefix}{uuid.uuid4().hex[:8]}"
                fd = create_at(dfd, tmp, 0o600)
                if lock_at(fd, dfd, tmp):
                    break
                os.close(fd)
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                    os.replace(tmp, self.path.name, src_dir_fd=dfd, dst_dir_fd=dfd)
            except BaseException:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp, dir_fd=dfd)
                raise

    def discard_abandoned(self) -> list[Path]:
        """Delete the temp files of writers that died mid-save (none a live writer holds); returns what went."""
        pattern = re.compile(re.escape(self._temp_prefix) + r"[A-Za-z0-9_]{8}")
        try:
            names = self.fs.listdir(self.path.parent)
        except FileNotFoundError:
            return []
        found = [self.path.parent / n for n in names if pattern.fullmatch(n)]
        return [p for p in found if discard_if_dead(p, self.fs)]

    @property
    def _temp_prefix(self) -> str:
        return f".{self.path.name}."
