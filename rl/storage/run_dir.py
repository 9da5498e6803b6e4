"""A run directory opened and checked once, at a command's door; every layer below takes the `RunDir` it yields.

`open_run` (a writer starting or resuming a run: `rl demo grpo`) and `open_existing_run` (a writer of a run already
there: `rl rescore`) do every check, in this order, and hold the run's writer lock (`rl.storage.run_lock`) while the
body runs. A `RunDir` is made only by them, so a function that takes one cannot be handed an unchecked path.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from rl.errors import InputError
from rl.storage.dead_writers import discard_if_dead
from rl.storage.run_layout import RunLayout, check_fresh, claim, require_safe, start_fresh
from rl.storage.run_lock import run_lock
from rl.storage.safe_fs import Tree

_OPENER = object()  # what only this module's openers pass to RunDir


class RunDir:
    """A run directory that passed its checks, its writer lock held while its opener's block runs.

    `root` is the directory as messages name it, `layout` the names of its entries, `fresh` whether `--fresh` emptied
    it of what an earlier run wrote."""

    __slots__ = ("fresh", "layout", "root")

    def __init__(self, root: Path, *, fresh: bool, opener: object) -> None:
        if opener is not _OPENER:
            raise TypeError(
                "a RunDir is made by rl.storage.run_dir.open_run or open_existing_run, which check the directory and "
                "hold its writer lock"
            )
        self.root, self.layout, self.fresh = root, RunLayout(root), fresh

    def __repr__(self) -> str:
        return f"RunDir({str(self.root)!r}, fresh={self.fresh})"


def checked(run: object) -> RunDir:
    """`run` if it is an opened `RunDir`; a `TypeError` otherwise (a plain path would skip its checks)."""
    if isinstance(run, RunDir):
        return run
    raise TypeError(
        f"expected a RunDir from rl.storage.run_dir.open_run, got {type(run).__name__}: a plain path skips the run "
        "directory's checks and lock"
    )


@contextmanager
def open_run(out: Path, *, command: str, fresh: bool = False) -> Iterator[RunDir]:
    """Open `out` to start (`fresh`: delete what an earlier run wrote there) or resume a run, holding its lock.

    Before its first side effect it refuses a file at `out` or above it (`InputError`) and, with `fresh`, a directory
    this tool did not make (`FreshRefusedError`); then it takes the lock (`RunLockedError`), empties a fresh run,
    proves `out` writable (the filesystem's `OSError`), marks it as a run directory, refuses an entry that is a link
    (`UnsafeRunDirError`) and deletes the staging directories of a base-model builder that died."""
    out = Path(out)
    check_out_dir(out)
    if fresh:
        check_fresh(out)
    # The lock before --fresh deletes anything: a second process is refused, and never clears a directory that
    # another one is writing.
    with run_lock(out, command=command):
        if fresh:
            start_fresh(out)
        ensure_writable_dir(out)
        root = out.absolute()
        claim(root)
        require_safe(root)
        # What a writer killed last time left half-written goes first; a live writer's files stay.
        discard_abandoned_bases(root)
        yield RunDir(root, fresh=fresh, opener=_OPENER)


@contextmanager
def open_existing_run(
    run_dir: Path, *, command: str, require: Callable[[RunLayout], None] = lambda layout: None
) -> Iterator[RunDir]:
    """Open the run in `run_dir` (not marked or created here) for a writer, holding its lock: an entry that is a link
    is refused (`UnsafeRunDirError`), then `require` (the command's own refusal, before the lock's files are made)."""
    run_dir = Path(run_dir)
    require_safe(run_dir)  # a run directory someone sent: an entry must not lead elsewhere
    require(RunLayout(run_dir))
    with run_lock(run_dir, command=command):
        yield RunDir(run_dir, fresh=False, opener=_OPENER)


def check_out_dir(out: Path) -> None:
    """Refuse an --out that names something other than a directory, before anything is written or deleted."""
    if out.exists() and not out.is_dir():
        raise InputError(f"--out {out} is a file, not a directory: pass --out a new or existing directory")
    for parent in out.parents:
        if parent.exists():
            if not parent.is_dir():
                raise InputError(f"--out {out} lies under {parent}, which is a file: pass --out another path")
            break


def ensure_writable_dir(out: Path) -> None:
    """Create --out and prove it writable with a temporary file; the filesystem's refusal (read-only, full, no
    permission) surfaces here as an `OSError`, before the run starts."""
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryFile(dir=out, prefix=".rl-write-probe-"):
        pass


def discard_abandoned_bases(root: Path) -> list[str]:
    """Delete base-model staging directories under `root` whose builder died (none a live builder holds)."""
    fs = Tree(root)
    names = [n for n in fs.listdir(root) if RunLayout.is_base_staging(n)]
    return [n for n in names if discard_if_dead(Path(fs.top) / n, fs)]
