"""How the `rl` command ends when a sub-command raises: one line that says what was wrong and what to do, and the
exit status of the error's family (`rl.errors`); the traceback only when asked for (`-v`, or `RL_TRACEBACK=1`).

An `RlError` is an expected failure and its message already says what to do; this adds the family's next step. An
`OSError` is the filesystem refusing (a full disk, a read-only mount, a file where a directory goes). Anything else
is a bug, so its traceback is always printed.
"""

from __future__ import annotations

import errno
import os
import sys
import traceback
from typing import TextIO

from rl.errors import CheckpointError, RlError, shown

OS_ERROR_EXIT = 10
BUG_EXIT = 70  # EX_SOFTWARE (sysexits.h): an internal error
INTERRUPTED_EXIT = 130  # 128 + SIGINT, what a shell reports for Ctrl-C

TRACEBACK_ENV = "RL_TRACEBACK"

# What a user can do about each errno a run directory's filesystem refuses with.
_OS_HINTS: dict[int, str] = {
    errno.ENOSPC: "the disk is full: free some space, or pass --out on another filesystem",
    errno.EDQUOT: "your disk quota is used up: free some space, or pass --out on another filesystem",
    errno.EROFS: "the filesystem is read-only: pass --out on a writable filesystem",
    errno.EACCES: "permission denied: pass --out a directory you can write, or fix its permissions",
    errno.EPERM: "operation not permitted: pass --out a directory you own",
    errno.ENOTDIR: "a file stands where a directory must go: pass --out a directory, or move the file",
    errno.EEXIST: "a file already exists where a directory must go: pass --out another path",
    errno.EISDIR: "a directory stands where a file must go: remove it or pass --out another path",
    errno.ENOENT: "a file or directory is missing: check the path",
}


def wants_traceback(verbose: bool) -> bool:
    """`-v`/`--verbose`, or RL_TRACEBACK set to anything but empty or 0."""
    return verbose or os.environ.get(TRACEBACK_ENV, "") not in ("", "0")


def _one_line(text: str) -> str:
    """One line, every control character left in it shown as its escape (`rl.errors.shown`): a message may quote a
    path or value from a run directory someone sent, and its escape sequences must not reach the terminal."""
    return shown(" ".join(text.split()), None)


def describe(exc: BaseException) -> str:
    """One line: what was wrong and what to do."""
    if isinstance(exc, RlError):
        message = _one_line(str(exc)) or type(exc).__name__
        if isinstance(exc, CheckpointError):
            message = f"cannot resume the run: {message}; pass --fresh to start over there, or --out another directory"
        return message
    if isinstance(exc, OSError):
        where = f" ({exc.filename})" if exc.filename else ""
        hint = _OS_HINTS.get(exc.errno or -1, "check the path and the filesystem")
        return _one_line(f"{exc.strerror or exc}{where}: {hint}")
    return f"internal error {type(exc).__name__}: {_one_line(str(exc))}"


def exit_code(exc: BaseException) -> int:
    """The family's exit status (`rl.errors`), 10 for the filesystem, 130 for Ctrl-C, 70 for a bug."""
    if isinstance(exc, RlError):
        return exc.exit_code
    if isinstance(exc, OSError):
        return OS_ERROR_EXIT
    if isinstance(exc, KeyboardInterrupt):
        return INTERRUPTED_EXIT
    return BUG_EXIT


def report(exc: BaseException, *, prog: str, verbose: bool, stream: TextIO | None = None) -> int:
    """Print `exc` for a user of `prog` and return the exit status the command ends with."""
    stream = stream if stream is not None else sys.stderr
    code = exit_code(exc)
    if isinstance(exc, KeyboardInterrupt):
        print(f"{prog}: interrupted", file=stream)
        return code
    expected = isinstance(exc, (RlError, OSError))
    if wants_traceback(verbose) or not expected:
        traceback.print_exception(exc, file=stream)
    print(f"{prog}: {describe(exc)}", file=stream)
    if not expected:
        print(f"{prog}: this is a bug in rl; please report it with the traceback above", file=stream)
    return code
