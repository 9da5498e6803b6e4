"""What a fork costs against a full copy, measured in the same run: the figures `rl bench` reports for volumes.

A world of `size_bytes` in many files is built once and sealed, then forked (what every trial does) and, for
comparison, copied with `shutil.copytree`. `*_bytes_written` counts what this process passed to write-like syscalls
(Linux's /proc/self/io `wchar`: not links or reflinks; None elsewhere), `*_disk_bytes` the drop in the filesystem's
free space (reflinked extents too, and anything else writing meanwhile). What each misses, and the tutorial's figures
to compare with: docs/benchmarks.md#how-the-other-sections-measure.

Run: `python -m rl.bench.volumes [SIZE_BYTES [DIR]]`.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rl import platform
from rl.storage.volumes.filesystem import ShareMode
from rl.storage.volumes.filesystem import force_rmtree as _force_rmtree
from rl.storage.volumes.store import LocalVolumeStore
from rl.storage.volumes.version import LocalVolumeVersion

GIB = 1 << 30


def bench_fork(
    size_bytes: int = GIB,
    *,
    directory: str | os.PathLike[str] | None = None,
    file_bytes: int = 1 << 20,
    share: ShareMode | None = None,
    settle_s: float | None = None,
) -> dict[str, Any]:
    """Fork time and bytes copied for a world of `size_bytes` (files of `file_bytes`), against a full copy.

    Everything lives in a fresh temporary directory under `directory` (default: the system's temp dir) and is removed
    afterwards. `share` forces a share mode; by default the filesystem is probed. `settle_s` is the pause between
    building the world and forking it (default: the store's racy window; see below).
    """
    if size_bytes <= 0 or file_bytes <= 0:
        raise ValueError(f"size_bytes and file_bytes must be positive, not {size_bytes} and {file_bytes}")
    tmp = Path(tempfile.mkdtemp(prefix="rl-bench-fork-", dir=directory))
    try:
        store = LocalVolumeStore(tmp / "store", share=share or "auto")
        files = _file_sizes(size_bytes, file_bytes)

        t0 = time.perf_counter()
        world = _build_world(store, files, file_bytes)
        build_s = time.perf_counter() - t0
        # A world is built once and forked later; waiting out the racy-mtime window keeps the trial's finalize from
        # re-hashing files only because they were written a moment ago.
        time.sleep(store.racy_ns / 1e9 if settle_s is None else settle_s)

        free, written = _free_bytes(tmp), _bytes_written()
        t0 = time.perf_counter()
        trial = world.fork("trial")
        mount = trial.mount()
        fork_s = time.perf_counter() - t0
        fork_written, fork_disk = _delta(_bytes_written(), written), free - _free_bytes(tmp)
        shared = sum(os.stat(mount / rel).st_ino == os.stat(world.path() / rel).st_ino for rel in world.files)

        t0 = time.perf_counter()
        trial.write_bytes(next(iter(world.files)), b"one edited document\n")
        trial.finalize("trial")
        trial_finalize_s = time.perf_counter() - t0

        free, written = _free_bytes(tmp), _bytes_written()
        t0 = time.perf_counter()
        shutil.copytree(world.path(), tmp / "copy")
        copy_s = time.perf_counter() - t0
        copy_written, copy_disk = _delta(_bytes_written(), written), free - _free_bytes(tmp)

        return {
            "size_bytes": sum(files),
            "files": len(files),
            "share_mode": store.share_mode,
            "build_s": build_s,
            "fork_s": fork_s,
            "fork_bytes_written": fork_written,
            "fork_disk_bytes": fork_disk,
            "fork_files_sharing_inode": shared,
            "trial_finalize_s": trial_finalize_s,
            "copy_s": copy_s,
            "copy_bytes_written": copy_written,
            "copy_disk_bytes": copy_disk,
            "speedup": copy_s / fork_s if fork_s > 0 else float("inf"),
            "bytes_ratio": (copy_written / max(fork_written, 1))
            if copy_written is not None and fork_written is not None
            else None,
        }
    finally:
        _force_rmtree(tmp)


def format_bench(result: dict[str, Any]) -> str:
    """A few human lines with the ratios."""
    r = result

    def written(key: str) -> str:
        return "n/a" if r[key] is None else _human(r[key])

    bytes_ratio = "n/a" if r["bytes_ratio"] is None else f"{r['bytes_ratio']:,.0f}x fewer bytes written"
    mib = 1 << 20
    return "\n".join(
        [
            f"world: {r['size_bytes'] / mib:,.0f} MiB in {r['files']} files, share mode {r['share_mode']}, "
            f"built and sealed in {r['build_s']:.2f} s",
            f"fork + mount: {r['fork_s'] * 1e3:.1f} ms, {written('fork_bytes_written')} written, "
            f"{_human(r['fork_disk_bytes'])} disk, {r['fork_files_sharing_inode']} files share the parent's inode",
            f"trial edit + finalize: {r['trial_finalize_s'] * 1e3:.1f} ms",
            f"full copy (shutil.copytree): {r['copy_s']:.2f} s, {written('copy_bytes_written')} written, "
            f"{_human(r['copy_disk_bytes'])} disk",
            f"fork vs copy: {r['speedup']:,.0f}x faster, {bytes_ratio}",
        ]
    )


def _human(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} B"


def _file_sizes(size_bytes: int, file_bytes: int) -> list[int]:
    full, rest = divmod(size_bytes, file_bytes)
    return [file_bytes] * full + ([rest] if rest else [])


def _build_world(store: LocalVolumeStore, sizes: list[int], file_bytes: int) -> LocalVolumeVersion:
    block = os.urandom(file_bytes)
    rw = store.new("world")
    with rw:
        for i, size in enumerate(sizes):
            # Distinct contents per file (a shared block would let a deduplicating filesystem flatter the copy).
            rw.write_bytes(f"docs/{i // 64:03d}/file-{i:05d}.bin", i.to_bytes(8, "little") + block[8:size])
        return rw.finalize(f"bench world of {sum(sizes)} bytes")


def _bytes_written() -> int | None:
    return platform.bytes_written()


def _delta(after: int | None, before: int | None) -> int | None:
    return None if after is None or before is None else after - before


def _free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    size = int(float(args[0])) if args else GIB
    print(format_bench(bench_fork(size, directory=args[1] if len(args) > 1 else None)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
