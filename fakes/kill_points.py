"""Kill points for real-process chaos: SIGKILL the demo at the Nth call of a chosen write, not at a random moment.

Random delays (`fakes.process_kills`) land wherever the clock says; a write that takes a millisecond is rarely hit. A
kill point names one filesystem step of one module (the volume store's publishing rename, the checkpoint's replace,
the artifact store's rename) and the process kills itself with SIGKILL just before or just after its Nth call, so the
torn state that step can leave is produced on purpose. Only calls made from that module's own code count (the caller's
file is checked, looking through `rl/storage/safe_fs.py`, which every write goes through), so `os.rename` elsewhere is
untouched. Armed from the command line before the CLI runs:

    python -c "from fakes.kill_points import arm_and_run; arm_and_run()" POINT N COUNT_FILE rl-args...

N = 0 kills nothing and writes how many calls the run made to COUNT_FILE at exit (the reference run's count, from
which the seeded Ns are drawn).
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class KillPoint:
    module_file: str
    """The caller's source path ends with this (`rl/storage/volumes/writable.py`)."""
    call: str
    """The `os` function whose calls from that file are counted."""
    after: bool
    """Kill after the call returns (its effect is on disk) instead of before it."""
    what: str


POINTS = {
    "volume-staged": KillPoint(
        "rl/storage/volumes/writable.py", "rename", False, "a volume version written, not yet published"
    ),
    "volume-published": KillPoint(
        "rl/storage/volumes/writable.py", "rename", True, "a volume version published, its directory not yet fsynced"
    ),
    "checkpoint": KillPoint(
        "rl/storage/checkpoint/file_store.py", "replace", False, "a checkpoint written and fsynced, not yet in place"
    ),
    "artifact-staged": KillPoint("rl/storage/artifacts.py", "rename", False, "an artifact written, not yet published"),
    "artifact-ref": KillPoint(
        "rl/storage/artifacts.py", "replace", False, "an artifact published, its name not yet updated"
    ),
}


def arm(point: KillPoint, nth: int, count_file: Path) -> None:
    """Count `point`'s calls; SIGKILL this process at the `nth` (0: never, and write the count at exit)."""
    real: Callable[..., Any] = getattr(os, point.call)
    calls = 0

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        frame = sys._getframe(1)
        while frame.f_back is not None and _file(frame).endswith("rl/storage/safe_fs.py"):
            frame = frame.f_back  # the module's own call, through the no-follow layer it writes with
        if not _file(frame).endswith(point.module_file):
            return real(*args, **kwargs)
        calls += 1
        if nth and calls == nth and not point.after:
            os.kill(os.getpid(), signal.SIGKILL)
        result = real(*args, **kwargs)
        if nth and calls == nth and point.after:
            os.kill(os.getpid(), signal.SIGKILL)
        return result

    setattr(os, point.call, wrapper)
    if not nth:
        atexit.register(lambda: count_file.write_text(str(calls)))


def _file(frame: Any) -> str:
    return frame.f_code.co_filename.replace(os.sep, "/")


def arm_and_run() -> None:
    name, nth, count_file, *rl_args = sys.argv[1:]
    if name not in POINTS:
        raise SystemExit(f"unknown kill point {name!r}; choose from {', '.join(POINTS)}")
    arm(POINTS[name], int(nth), Path(count_file))
    from rl.cli import main

    sys.exit(main(rl_args))
