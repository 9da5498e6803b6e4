"""Every process a command started, found and killed by an environment mark, wherever it went.

torchrun starts its workers in new sessions (setsid), so killing a command's process group leaves them running, still
holding the GPU; once their parent dies they are re-parented, so a walk of the process tree misses them too. What every
descendant keeps is its environment: `marked_env` adds a variable of a fresh name (`RL_PROC_MARK_<hex>=1`, a name per
mark, so marks nest: a torchrun inside the device check's pytest carries both), and `kill_marked` SIGKILLs every process
whose /proc/PID/environ holds it, scanning again until none is left (a process may fork while it is being killed).

Linux only (it reads /proc: the device machine, CI and the CPU tests); elsewhere it finds nothing and the callers'
process-group kill is all there is.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
from pathlib import Path

PROC = Path("/proc")
SETTLE_S = 30.0  # bounds a kill loop against a process that keeps forking; SIGKILL itself cannot be caught


def new_mark() -> str:
    """A variable name no other run uses."""
    return f"RL_PROC_MARK_{uuid.uuid4().hex[:16]}"


def marked_env(env: dict[str, str], mark: str) -> dict[str, str]:
    """`env` with `mark` set: every process started with it, and each descendant keeping its environment, carries it."""
    return {**env, mark: "1"}


def marked(mark: str) -> list[int]:
    """The live processes (not this one) whose environment holds `mark`; a zombie's environment reads empty."""
    needle = f"{mark}=1".encode()
    found = []
    try:
        entries = [e.name for e in os.scandir(PROC) if e.name.isdigit()]
    except OSError:
        return []
    for name in entries:
        pid = int(name)
        if pid == os.getpid():
            continue
        try:
            environ = (PROC / name / "environ").read_bytes()
        except OSError:  # gone, or not ours to read
            continue
        if needle in environ.split(b"\0"):
            found.append(pid)
    return found


def kill_marked(mark: str, *, settle_s: float = SETTLE_S) -> list[int]:
    """SIGKILL every process carrying `mark` until a scan finds none; the pids killed. Raises RuntimeError naming the
    survivors if some are still there after `settle_s` (a hang guard: a killed process is normally gone in ms)."""
    killed: set[int] = set()
    deadline = time.monotonic() + settle_s
    while True:
        pids = marked(mark)
        if not pids:
            return sorted(killed)
        if time.monotonic() > deadline:
            raise RuntimeError(f"processes {sorted(pids)} survive SIGKILL after {settle_s:.0f} s (mark {mark})")
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        killed.update(pids)
        time.sleep(0.02)  # let the kernel tear them down before the next scan
