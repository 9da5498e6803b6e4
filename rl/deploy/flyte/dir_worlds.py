"""`DirWorlds`: the agentic worlds on `flyte.io.Dir` (open-source Flyte), each trial in a private local copy."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path

from flyte.io import Dir

from rl.deploy.flyte.bindings import task_context
from rl.protocols import Workspace
from rl.storage.artifacts import compute_digest, read_dir


class _DirWorkspace:
    """A trial's private copy of a world: a local directory; `finalize` stages it for upload as the trial's world."""

    def __init__(self, store: DirWorlds, root: Path, name: str) -> None:
        self.store, self.root, self._name = store, root, name

    @property
    def name(self) -> str:
        return self._name

    def read_text(self, relpath: str) -> str:
        return (self.root / relpath).read_text()

    def write_text(self, relpath: str, text: str) -> None:
        path = self.root / relpath
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)

    def finalize(self, message: str) -> str:
        return self.store.stage(self.root, self._name)

    def abandon(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


class DirWorlds:
    """`WorldStore` on `flyte.io.Dir` (open-source Flyte): a version is a Dir's path; a fork is a private local copy.

    Slower per trial than a copy-on-write volume fork for a large world, with the same isolation: the trial writes
    into its own copy, and a sealed version never changes.

    Flyte's I/O is async and a task body may not block on it, while `WorldStore` is synchronous. So the store works
    in two phases around the synchronous calls: `await prefetch(version)` downloads a version before `fork`/`read`
    use it, and `seal`/`finalize` write locally, reserve the version's remote path, and leave the upload to
    `await flush()`. Use it as an async context manager (`async with DirWorlds() as worlds:`) to flush on success and
    clean up either way.
    """

    def __init__(self) -> None:
        self._tmp = Path(tempfile.mkdtemp(prefix="rl-worlds-"))
        self._local: dict[str, Path] = {}
        self._pending: list[tuple[Path, str, str]] = []

    async def __aenter__(self) -> DirWorlds:
        return self

    async def __aexit__(self, exc_type: object, exc: object, tb: object) -> None:
        try:
            if exc_type is None:
                await self.flush()
        finally:
            shutil.rmtree(self._tmp, ignore_errors=True)

    async def prefetch(self, version: str) -> None:
        """Download the sealed version `version` (a private copy) so `fork` and `read` can use it."""
        if version not in self._local:
            local = self._tmp / f"v{len(self._local)}"
            await Dir.from_existing_remote(version).download(local_path=local)  # a copy, even of a local path
            self._local[version] = local

    def stage(self, root: Path, name: str) -> str:
        """Reserve a remote path for the directory `root`, to be uploaded by `flush`; returns it (the version)."""
        staged = self._tmp / f"staged-{len(self._pending)}" / name
        shutil.copytree(root, staged)
        destination = task_context().raw_data_path.get_random_remote_path(name)
        self._pending.append((staged, destination, compute_digest(read_dir(staged))))
        self._local[destination] = staged
        return destination

    async def flush(self) -> None:
        """Upload everything `seal` and `finalize` staged."""
        pending, self._pending = self._pending, []
        for staged, destination, digest in pending:
            await Dir.from_local(staged, remote_destination=destination, dir_cache_key=digest)

    def seal(self, name: str, files: Mapping[str, str], message: str) -> str:
        root = self._tmp / f"seal-{len(self._pending)}" / name
        for relpath, text in sorted(files.items()):
            path = root / relpath
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        return self.stage(root, name)

    def _local_copy(self, version: str) -> Path:
        try:
            return self._local[version]
        except KeyError:
            raise RuntimeError(f"world version {version} was not prefetched; await prefetch(version) first") from None

    def fork(self, version: str, name: str) -> Workspace:
        root = Path(tempfile.mkdtemp(prefix="fork-", dir=self._tmp)) / name
        shutil.copytree(self._local_copy(version), root)
        return _DirWorkspace(self, root, name)

    def read(self, version: str) -> dict[str, str]:
        return {relpath: data.decode() for relpath, data in read_dir(self._local_copy(version)).items()}
