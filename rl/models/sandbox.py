"""A model directory's tokenizer run where it cannot hang, exhaust memory or panic this process: a forked worker.

A tokenizer is code the directory chooses: its pre-tokenizer is a regular expression (one with catastrophic
backtracking runs for minutes or makes the tokenizers library panic, and a panic is a `BaseException`), its chat
template a Jinja program (`{{ 'x' * 10**10 }}` asks for 10 GB, two nested loops over `range(10**6)` run for hours; a
deadline checked between chunks of output never fires while one expression evaluates). So the tokenizer is built, and
every prompt rendered, encoded and decoded, in a worker process forked once per tokenizer, whose limits the kernel
enforces: `SandboxLimits.cpu_s` of CPU per request (RLIMIT_CPU, raised before each), `memory_bytes` of address space
beyond what it had at the fork (RLIMIT_AS), and a wall-clock guard in this process for a worker that waits instead of
computing. A request that breaks a limit, or any failure of the library (a panic, `MemoryError`, an exception) ends
in `ModelSandboxError`: one line, exit status 2. The worker ignores Ctrl-C (this process handles it), writes nothing to
the terminal (its stdout and stderr are /dev/null) and dies with this process. docs/guarantees.md says what it bounds.
"""

from __future__ import annotations

import contextlib
import gc
import os
import pickle
import select
import signal
import struct
import sys
import threading
import time
import warnings
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn, TypeVar

from rl.errors import ModelSandboxError, RlError, shown

__all__ = ["DEFAULT_LIMITS", "SandboxLimits", "TokenizerSandbox", "in_process", "sandbox_of"]

T = TypeVar("T")
_HEADER = struct.Struct("<Q")
_PANIC = "PanicException"  # pyo3_runtime.PanicException: a Rust panic inside the tokenizers library


@dataclass(frozen=True)
class SandboxLimits:
    """What one request to a tokenizer's worker may use (a build, or one batch of prompts)."""

    cpu_s: int = 30  # a real tokenizer builds in ~0.3 s and encodes a run's prompts in milliseconds
    wall_s: float = 300.0  # only against a worker that waits without computing; CPU time is the real bound
    memory_bytes: int = 2 << 30  # address space beyond the worker's size at the fork
    text_chars: int = 1 << 18  # a rendered prompt or decoded text longer than this is refused
    reply_bytes: int = 256 << 20


DEFAULT_LIMITS = SandboxLimits()


_SANDBOXES: weakref.WeakKeyDictionary[Any, TokenizerSandbox] = weakref.WeakKeyDictionary()


def sandbox_of(tokenizer: Any) -> TokenizerSandbox | None:
    """The worker that holds `tokenizer`'s twin (`rl.models.load_tokenizer` attaches one), None for one built here."""
    try:
        return _SANDBOXES.get(tokenizer)
    except TypeError:  # not weakly referenceable: not a tokenizer this tool loaded
        return None


def in_process(where: str, what: str, work: Callable[[], T]) -> T:
    """`work()`, with a panic of a native library (a `BaseException` that is not an `Exception`) as a
    `ModelSandboxError`; Ctrl-C and exits pass through."""
    try:
        return work()
    except (KeyboardInterrupt, SystemExit, GeneratorExit):
        raise
    except RlError:
        raise
    except BaseException as exc:
        if isinstance(exc, Exception) and type(exc).__name__ != _PANIC:
            raise
        raise _failed(where, what, f"{type(exc).__name__}: {exc}") from None


SANDBOX_FIX = (
    "a model's tokenizer and chat template run only within time and memory limits (docs/guarantees.md): use the "
    "tokenizer files the model was published with"
)


def _failed(where: str, what: str, why: str) -> ModelSandboxError:
    return ModelSandboxError(
        f"model directory {shown(where)}: {what} failed ({shown(' '.join(why.split()), 300)}); {SANDBOX_FIX}"
    )


class TokenizerSandbox:
    """A worker process, forked from this one, that builds a tokenizer with `build()` and runs functions on it.

    `run(fn, *args)` returns `fn(tokenizer, *args)` computed in the worker within `limits`, or raises
    `ModelSandboxError`. `fn` and its result cross by pickle (module-level functions, plain values). One request at a
    time (a lock); a worker that died is forked again (and builds again) on the next request.
    """

    def __init__(self, build: Callable[[], Any], where: str, limits: SandboxLimits | None = None) -> None:
        self.build, self.where = build, where
        self.limits = limits if limits is not None else DEFAULT_LIMITS
        self._lock = threading.Lock()
        self._worker: _Worker | None = None
        with self._lock:
            self._start()

    def attach(self, tokenizer: Any) -> None:
        """Route `tokenizer`'s encoding through this worker (`sandbox_of`); the worker lives while `tokenizer` does."""
        _SANDBOXES[tokenizer] = self

    def close(self) -> None:
        with self._lock:
            if self._worker is not None:
                self._worker.stop()
                self._worker = None

    def run(self, fn: Callable[..., T], *args: Any, what: str = "encoding a prompt with its tokenizer") -> T:
        with self._lock:
            if self._worker is None:
                self._start()
            return self._request((fn, args), what)  # type: ignore[return-value]

    def _start(self) -> None:
        self._worker = _Worker.fork(self.build, self.limits)
        self._request(None, "building its tokenizer")

    def _request(self, message: object, what: str) -> object:
        worker = self._worker
        assert worker is not None
        try:
            status, value = worker.ask(message, self.limits)
        except _WorkerGone as gone:
            worker.stop()
            self._worker = None
            raise _failed(self.where, what, gone.why(self.limits)) from None
        except BaseException:  # Ctrl-C while it works: its reply would answer the next request, so it goes
            worker.stop()
            self._worker = None
            raise
        if status == "ok":
            return value
        if status == "raise" and isinstance(value, RlError):
            raise value
        raise _failed(self.where, what, str(value))


class _WorkerGone(Exception):
    def __init__(self, status: int | None, reason: str = "") -> None:
        super().__init__(status)
        self.status, self.reason = status, reason

    def why(self, limits: SandboxLimits) -> str:
        if self.reason:
            return self.reason
        if self.status is not None and os.WIFSIGNALED(self.status):
            sig = os.WTERMSIG(self.status)
            if sig == signal.SIGXCPU:
                return f"it used more than {limits.cpu_s} s of CPU time"
            return f"its worker was killed by {signal.Signals(sig).name} (out of memory?)"
        return "its worker ended unexpectedly" + (f" (exit {os.WEXITSTATUS(self.status)})" if self.status else "")


class _Worker:
    def __init__(self, pid: int, requests: int, replies: int) -> None:
        self.pid, self.requests, self.replies = pid, requests, replies
        self._finalizer = weakref.finalize(self, _reap, pid, requests, replies)

    @classmethod
    def fork(cls, build: Callable[[], Any], limits: SandboxLimits) -> _Worker:
        req_r, req_w = os.pipe()
        rep_r, rep_w = os.pipe()
        # The tokenizers library prints a warning at a fork after it ran threads unless this is set; the worker
        # keeps it (its thread pool did not survive the fork), this process gets back what it had.
        before = os.environ.get("TOKENIZERS_PARALLELISM")
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
        with warnings.catch_warnings():
            # Python 3.12+ warns of a fork with threads running (torch's): the worker runs no code that waits for them.
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:  # the worker: never returns
            os.close(req_w)
            os.close(rep_r)
            _serve(build, limits, req_r, rep_w)
        if before is None:
            os.environ.pop("TOKENIZERS_PARALLELISM", None)
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = before
        os.close(req_r)
        os.close(rep_w)
        return cls(pid, req_w, rep_r)

    def ask(self, message: object, limits: SandboxLimits) -> tuple[str, object]:
        try:
            _send(self.requests, message)
        except OSError:  # BrokenPipeError: it died since the last request
            raise _WorkerGone(self._wait()) from None
        try:
            data = _receive(self.replies, time.monotonic() + limits.wall_s, limits.reply_bytes)
        except TimeoutError:
            raise _WorkerGone(None, f"it did not finish within {limits.wall_s:g} s") from None
        except OverflowError:
            raise _WorkerGone(None, f"its result was larger than {limits.reply_bytes} bytes") from None
        if data is None:
            raise _WorkerGone(self._wait())
        reply = pickle.loads(data)  # from our own worker, forked from this process
        return reply[0], reply[1]

    def _wait(self) -> int | None:
        with contextlib.suppress(ChildProcessError):
            pid, status = os.waitpid(self.pid, 0)
            self._finalizer.detach()
            _close(self.requests, self.replies)
            return status if pid else None
        return None

    def stop(self) -> None:
        self._finalizer()


def _reap(pid: int, requests: int, replies: int) -> None:
    _close(requests, replies)
    with contextlib.suppress(ProcessLookupError, ChildProcessError):
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


def _close(*fds: int) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


def _send(fd: int, message: object) -> None:
    data = pickle.dumps(message)
    view = memoryview(_HEADER.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view) :]


def _receive(fd: int, deadline: float | None, limit: int) -> bytes | None:
    """One message from `fd`, None at end of file; `TimeoutError` past `deadline`, `OverflowError` past `limit`."""
    header = _read_exactly(fd, _HEADER.size, deadline)
    if header is None:
        return None
    (size,) = _HEADER.unpack(header)
    if size > limit:
        raise OverflowError(size)
    return _read_exactly(fd, size, deadline)


def _read_exactly(fd: int, size: int, deadline: float | None) -> bytes | None:
    chunks, got = [], 0
    while got < size:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError
        chunk = os.read(fd, min(size - got, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _serve(build: Callable[[], Any], limits: SandboxLimits, requests: int, replies: int) -> NoReturn:
    """The worker's loop: build, then answer requests until this process closes the pipe. Ends by `os._exit`."""
    try:
        _isolate(requests, replies)
        _limit_memory(limits.memory_bytes)
        tokenizer: Any = None
        while True:
            data = _receive(requests, None, 1 << 40)
            if data is None:
                break
            _limit_cpu(limits.cpu_s)
            request = pickle.loads(data)
            try:
                if request is None:
                    tokenizer = build()
                    reply: tuple[str, object] = ("ok", None)
                else:
                    fn, args = request
                    reply = ("ok", fn(tokenizer, *args))
            except (KeyboardInterrupt, SystemExit):
                raise
            except MemoryError:
                reply = ("error", f"MemoryError: it needed more than {limits.memory_bytes >> 20} MiB of memory")
            except RlError as exc:
                reply = ("raise", exc)
            except BaseException as exc:  # a panic of the tokenizers library is a BaseException
                reply = ("error", f"{type(exc).__name__}: {str(exc)[:2000]}")
            try:
                _send(replies, reply)
            except (pickle.PicklingError, TypeError, AttributeError) as exc:
                _send(replies, ("error", f"its result cannot be returned ({type(exc).__name__})"))
    finally:
        os._exit(0)


def _isolate(*keep: int) -> None:
    import resource  # POSIX-only: imported where used (rl.platform)

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: this process handles it
    signal.signal(signal.SIGXCPU, signal.SIG_DFL)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):  # a panic's message and backtrace, the library's prints: never the terminal
        os.dup2(devnull, fd)
    # Every other inherited descriptor closed (a run directory's lock among them: a flock is held while any copy of
    # it is open); the parent's objects frozen, so no collection closes a number reused since.
    gc.freeze()
    low = 3
    for fd in sorted(keep):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, os.sysconf("SC_OPEN_MAX") if hasattr(os, "sysconf") else 1 << 16)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if sys.platform == "linux":  # die with the parent (prctl PR_SET_PDEATHSIG)
        with contextlib.suppress(OSError, AttributeError):
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)


def _limit_memory(extra: int) -> None:
    """RLIMIT_AS at the worker's size now (it shares the parent's mappings) plus `extra` bytes."""
    import resource

    try:
        with open("/proc/self/status") as status:
            size = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize:"))
    except (OSError, StopIteration, ValueError):
        return  # not Linux: the CPU limit and the wall-clock guard still bound it
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = size + extra if hard == resource.RLIM_INFINITY else min(size + extra, hard)
    resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def _limit_cpu(seconds: int) -> None:
    """RLIMIT_CPU at the CPU time used so far plus `seconds`: the limit is per process, so it is raised per request."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    soft = int(usage.ru_utime + usage.ru_stime) + seconds + 1
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))
