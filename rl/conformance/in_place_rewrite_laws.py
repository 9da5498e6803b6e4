"""The volume law on in-place rewrites, mixed into `VolumeStoreContract`: a fork's file rewritten in place, keeping its
size, mode and mtime, is published with its new content, or finalize refuses it; never under its parent's digest.

A store that skips reading an inherited file it believes unchanged (git's stat check: same inode, size and mtime) must
still read one whose mtime is too close to the fork to prove anything (git's "racy clean"): a write within one
timestamp step leaves the mtime as it was, and root or a store with writable mounts writes in place. The law stamps the
parent's file with a future mtime (inside any racy window, however slow the machine), rewrites the fork's copy in place
with as many bytes, puts its mode and mtime back, and checks the version against the same change written by rename:
content addressing makes them one version. A store may instead refuse the finalize (ours does where the fork's file is
still a hard link to its parent's: the parent changed too).
"""

from __future__ import annotations

import gc
import os
import stat
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from rl.conformance.support.contract_base import tier
from rl.protocols import VolumeStore

__all__ = ["InPlaceRewriteLaws"]

FUTURE_S = 3600
"""How far ahead of now the parent's file is stamped: past any racy window and any run of the law."""


def rewrite_in_place(path: Path, data: bytes) -> None:
    """Write `data` over `path`'s bytes in its own inode, then put its mode and timestamps back as they were (what
    root's write within one timestamp step leaves behind)."""
    before = os.stat(path)
    os.chmod(path, stat.S_IMODE(before.st_mode) | stat.S_IWUSR)
    with open(path, "r+b") as f:
        f.write(data)
        f.truncate(len(data))
    os.chmod(path, stat.S_IMODE(before.st_mode))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))


@tier("volumes")
class InPlaceRewriteLaws:
    """Needs `volume_store_factory` and `machine` (`VolumeStoreContract`'s)."""

    def test_volumes_a_file_rewritten_in_place_is_published_with_its_new_content(
        self, volume_store_factory: Callable[[], VolumeStore]
    ) -> None:
        """A fork's inherited file rewritten in place with as many bytes, its mode and mtime put back, finalizes into
        the same version as that change written by rename (its new content's address), or finalize refuses it; the
        version reads back the new bytes."""
        store = volume_store_factory()
        machine = self.machine  # type: ignore[attr-defined]
        old, new = b"row 0: reward 0.25\n", b"row 0: reward 0.75\n"
        rw = store.new(f"law-rewrite-{uuid.uuid4().hex[:8]}")
        machine.write_file(rw, "iter-0.jsonl", old)
        future = time.time_ns() + FUTURE_S * 10**9
        os.utime(Path(rw.mount()) / "iter-0.jsonl", ns=(future, future))
        parent = rw.finalize("parent")
        name = f"law-rewritten-{uuid.uuid4().hex[:8]}"
        by_rename = parent.fork(name)
        machine.write_file(by_rename, "iter-0.jsonl", new)
        expected = by_rename.finalize("rewrite")
        in_place = parent.fork(name)
        rewrite_in_place(Path(in_place.mount()) / "iter-0.jsonl", new)
        try:
            got = in_place.finalize("rewrite")
        except Exception:
            machine.lose_writer(in_place)  # refused: the store knows the parent's file changed under it
            del in_place
            gc.collect()
            return
        content = (Path(got.path()) / "iter-0.jsonl").read_bytes()
        assert content == new, f"the version published after an in-place rewrite reads {content!r}, not {new!r}"
        assert got.version == expected.version, (
            f"a fork's iter-0.jsonl rewritten in place (same size, mode and mtime, the parent's mtime within any racy "
            f"window) finalized as version {got.version}, and the same change written by rename as "
            f"{expected.version}: the store kept the parent's digest for a file whose bytes changed. Re-read a file "
            "whose mtime is too close to the fork to prove it unchanged (git's racy clean), or hash every file"
        )
