"""What differs between the operating systems we run on, in one place: file clones, file locks, per-process I/O counts.

flyte-rl runs on Linux and macOS. Windows is refused at `import rl` (use WSL): the volume store and the dead-writer
cleanup lock open directories and rely on POSIX flock semantics (the kernel drops the lock when its holder dies), and
Windows can neither open a directory as a file nor give byte-range locks those semantics.

Every other module of `rl` imports no POSIX-only module (fcntl, termios, resource, ...) at module level; this one
imports them only where they exist (tests/test_platform.py holds both to that, and forces each fallback on Linux).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import sys
from collections.abc import Callable
from pathlib import Path

try:
    import fcntl
except ImportError:  # Windows: refused by `refuse_unsupported` before anything here is called
    fcntl = None  # type: ignore[assignment]

UNSUPPORTED_MESSAGE = (
    "flyte-rl runs on Linux and macOS, not on Windows ({platform}): use WSL "
    "(https://learn.microsoft.com/windows/wsl/install) and install it there"
)

# fcntl.FICLONE exists only from Python 3.12; this is Linux's _IOW(0x94, 9, int).
FICLONE = getattr(fcntl, "FICLONE", 0x40049409)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
PROC_SELF_IO = "/proc/self/io"


def refuse_unsupported(platform: str = sys.platform) -> None:
    """Raise ImportError, in one line saying to use WSL, on Windows; nothing elsewhere."""
    if platform == "win32" or platform == "cygwin":
        raise ImportError(UNSUPPORTED_MESSAGE.format(platform=platform))


def _clone_ficlone(src_fd: int, dir_fd: int, name: str) -> bool:
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=dir_fd)
    try:
        fcntl.ioctl(fd, FICLONE, src_fd)
    finally:
        os.close(fd)
    return True


def _libc_fclonefileat() -> Callable[[int, int, bytes, int], int] | None:
    """macOS's fclonefileat(2) (APFS, since 10.12), or None where this libc has none."""
    try:
        func = ctypes.CDLL(None, use_errno=True).fclonefileat
    except (OSError, AttributeError):
        return None
    func.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32)
    func.restype = ctypes.c_int
    return func


def _clone_clonefile(src_fd: int, dir_fd: int, name: str) -> bool:
    fclonefileat = _libc_fclonefileat()
    if fclonefileat is None:
        return False
    # The source is a descriptor and the destination a new name in a held directory: no path is followed.
    if fclonefileat(src_fd, dir_fd, os.fsencode(name), 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), name)
    return True


def _clone_none(src_fd: int, dir_fd: int, name: str) -> bool:
    return False


Cloner = Callable[[int, int, str], bool]
CLONERS: dict[str, Cloner] = {
    "ficlone": _clone_ficlone,
    "clonefile": _clone_clonefile,
    "none": _clone_none,
}
# Which clone this platform has, and its cloner: what `clone_at` and the stores that call it use unless given another.
CLONE = {"linux": "ficlone", "darwin": "clonefile"}.get(sys.platform, "none")
CLONER = CLONERS[CLONE]


def clone_at(src_fd: int, dir_fd: int, name: str, cloner: Cloner = CLONER) -> bool:
    """Make `name` in the directory `dir_fd` a copy-on-write clone of the open regular file `src_fd` (`cloner`: FICLONE
    on Linux, fclonefileat on macOS); False, leaving no `name`, where the platform or the filesystem cannot (the caller
    then hard links or copies). An existing `name` is an error (FileExistsError), never replaced or removed."""
    try:
        return cloner(src_fd, dir_fd, name)
    except FileExistsError:
        raise
    except OSError:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=dir_fd)
        return False


def clone_file(src: Path, dst: Path, cloner: Cloner = CLONER) -> bool:
    """`clone_at` by path, for a directory of our own (a probe): src and dst's directory are opened as given."""
    src_fd = os.open(src, os.O_RDONLY | os.O_CLOEXEC)
    try:
        dir_fd = os.open(os.path.dirname(dst) or ".", os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | os.O_CLOEXEC)
        try:
            return clone_at(src_fd, dir_fd, os.path.basename(dst), cloner)
        finally:
            os.close(dir_fd)
    finally:
        os.close(src_fd)


class _OpenHow(ctypes.Structure):
    _fields_ = (("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64))


_SYS_OPENAT2 = 437  # the same number on every Linux architecture (since 5.6)
_RESOLVE_NO_SYMLINKS = 0x04  # no symlink anywhere on the path, the last component included
_RESOLVE_BENEATH = 0x08  # nothing outside the starting directory


def _libc_syscall() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        func = ctypes.CDLL(None, use_errno=True).syscall
    except (OSError, AttributeError):
        return None
    func.restype = ctypes.c_long
    return func


# Linux's openat2(2), or None: macOS, a kernel before 5.6, or a sandbox that refuses it (found on first use).
OPENAT2: Callable[..., int] | None = _libc_syscall()


def open_beneath(dir_fd: int, path: str, flags: int) -> int | None:
    """`openat(dir_fd, path, flags)` in one syscall that follows no symlink on the way and stays beneath `dir_fd`
    (openat2 with RESOLVE_NO_SYMLINKS | RESOLVE_BENEATH); None where that fails for any reason, and the caller walks
    the path one component at a time, which names whatever refused it."""
    global OPENAT2
    if OPENAT2 is None:
        return None
    how = _OpenHow(flags | os.O_CLOEXEC, 0, _RESOLVE_NO_SYMLINKS | _RESOLVE_BENEATH)
    fd = OPENAT2(_SYS_OPENAT2, dir_fd, os.fsencode(path), ctypes.byref(how), ctypes.sizeof(how))
    if fd >= 0:
        return fd
    if ctypes.get_errno() in (errno.ENOSYS, errno.EPERM, errno.EINVAL):  # no openat2 here: walk from now on
        OPENAT2 = None
    return None


HAS_FLOCK = fcntl is not None


def flock(fd: int, *, exclusive: bool = True, blocking: bool = True, available: bool = HAS_FLOCK) -> None:
    """flock(2) `fd`: BlockingIOError when not `blocking` and another holds it; OSError where locks are unsupported
    (some NFS mounts, and any platform without fcntl: not `available`), which callers treat as 'this filesystem cannot
    lock'."""
    if not available:
        raise OSError(errno.EOPNOTSUPP, "this platform has no flock")  # as an NFS mount that refuses flock says
    op = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
    fcntl.flock(fd, op if blocking else op | fcntl.LOCK_NB)


def unlock(fd: int) -> None:
    if HAS_FLOCK:
        fcntl.flock(fd, fcntl.LOCK_UN)


def bytes_written() -> int | None:
    """What this process has passed to write-like syscalls (Linux's /proc/self/io `wchar`); None where the platform
    does not count it (macOS has no /proc)."""
    try:
        with open(PROC_SELF_IO) as f:
            return next(int(line.split()[1]) for line in f if line.startswith("wchar"))
    except (OSError, StopIteration, ValueError, IndexError):
        return None
