"""Starting vLLM: the KV cache its CPU build gets where the user set none, and the root cause of a failed start, read
from the stderr its processes wrote (`StderrTee`) for `rl.samplers.vllm_start_errors` to explain."""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading
from pathlib import Path

__all__ = ["GIB", "KVCACHE_MAX_GIB", "StderrTee", "available_memory_bytes", "cpu_kvcache_gib", "start_failure_cause"]

GIB = 2**30
KVCACHE_MAX_GIB = 4


def available_memory_bytes() -> int:
    """Memory this machine can hand out now without swapping: /proc/meminfo's MemAvailable, else free pages."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))


def cpu_kvcache_gib(available_bytes: int) -> int:
    """The KV cache (GiB) the engine gives vLLM's CPU build where `VLLM_CPU_KVCACHE_SPACE` is unset: a quarter of
    the memory available now, at least 1 and at most `KVCACHE_MAX_GIB`. Without it, vLLM 0.32's CPU worker reserves
    `gpu_memory_utilization` (0.9) of the machine's *total* memory and refuses to start ("Available memory ... is
    less than desired CPU memory utilization") wherever other processes hold more than a tenth of it."""
    return max(1, min(KVCACHE_MAX_GIB, available_bytes // 4 // GIB))


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_PROCESS_PREFIX = re.compile(
    r"^\([\w.-]+ pid=\d+\)\s*"
)  # vLLM prefixes its processes' lines: "(EngineCore_DP0 pid=7) "
_EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_]\w*\.)*(?:[A-Z]\w*)?(?:Error|Exception|Exit)(?::\s.*)?$")
_GENERIC = re.compile(r"root cause|stack trace|initialization failed|failed to start", re.IGNORECASE)


def start_failure_cause(log: str) -> str | None:
    """The root cause of a failed vLLM start in what its processes wrote to stderr: the first exception line
    (`ValueError: ...`) that is not one of vLLM's own "see the root cause above" wrappers; None if there is none."""
    found = [
        line
        for raw in log.splitlines()
        if _EXCEPTION_LINE.match(line := _PROCESS_PREFIX.sub("", _ANSI.sub("", raw)).strip())
    ]
    specific = [line for line in found if not _GENERIC.search(line)]
    return (specific or found)[0] if found else None


class StderrTee:
    """While open, file descriptor 2 of this process, and of every process started meanwhile (vLLM's engine core and
    worker, for their whole life), goes into a pipe; a thread forwards it to the original stderr and keeps the last
    64 KiB, where vLLM's engine process logs why it failed to start."""

    _KEEP = 64 * 1024

    def __init__(self) -> None:
        self._tail = bytearray()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._saved: int | None = None

    def __enter__(self) -> StderrTee:
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.flush()
        try:
            self._saved = os.dup(2)
        except OSError:  # no stderr to tee
            return self
        read_end, write_end = os.pipe()
        os.dup2(write_end, 2)
        os.close(write_end)
        self._thread = threading.Thread(target=self._pump, args=(read_end, os.dup(self._saved)), daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.flush()
        if self._saved is not None:
            os.dup2(self._saved, 2)
            os.close(self._saved)
            self._saved = None

    def _pump(self, read_end: int, out: int) -> None:
        try:
            while chunk := os.read(read_end, 65536):
                with contextlib.suppress(OSError):
                    view = memoryview(chunk)
                    while view:
                        view = view[os.write(out, view) :]
                with self._lock:
                    self._tail += chunk
                    del self._tail[: -self._KEEP]
        finally:
            os.close(read_end)
            os.close(out)

    def text(self, wait_s: float = 5.0) -> str:
        """What was written so far, after waiting up to `wait_s` for the writers (a dying engine) to finish."""
        if self._thread is not None:
            self._thread.join(wait_s)
        with self._lock:
            return self._tail.decode(errors="replace")
