"""In-memory artifacts with copy semantics and a content digest (the `flyte.io.Dir` role).

Fault model: none by default; `lose(ref)` deletes an artifact so a test can check what a driver does when the adapter
its checkpoint names is gone.
"""

from __future__ import annotations

from collections.abc import Mapping

from rl.errors import ArtifactNotFoundError
from rl.identity import content_digest
from rl.types import ArtifactRef


class MemoryArtifacts:
    """Content-addressed: equal files give equal refs, so a replayed step that recomputes an artifact gets its ref."""

    def __init__(self) -> None:
        self._blobs: dict[str, dict[str, bytes]] = {}
        self.puts = 0

    async def put(self, files: Mapping[str, bytes], *, name: str) -> ArtifactRef:
        snapshot = {path: bytes(data) for path, data in files.items()}
        digest = content_digest(snapshot)
        self._blobs[digest] = snapshot
        self.puts += 1
        return ArtifactRef(uri=f"mem://{name}/{digest}", digest=digest)

    async def get(self, ref: ArtifactRef) -> dict[str, bytes]:
        try:
            stored = self._blobs[ref.digest]
        except KeyError:
            raise ArtifactNotFoundError(f"artifact {ref.uri} does not exist in this store") from None
        return dict(stored)  # bytes are immutable; a new dict is a private copy

    async def exists(self, ref: ArtifactRef) -> bool:
        return ref.digest in self._blobs

    def lose(self, ref: ArtifactRef) -> None:
        self._blobs.pop(ref.digest, None)
