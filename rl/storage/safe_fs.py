"""Every file the tool opens, creates, renames or deletes under a run directory goes through a `Tree`: no symlink below
the tree's top is ever followed.

A run directory may come from someone else, and any folder in it may be swapped for a symlink while a command runs,
after whatever check it passed. So nothing below a tree's top is reached by path: each operation opens the top, then
the directory below it in one `openat2` with no symlink resolved (Linux) or one component at a time (`openat` with
`O_NOFOLLOW`), and acts on the last component relative to its parent's descriptor (`unlinkat`, `renameat`, ...). A
symlink met on the way is refused with `LinkRefusedError` (a `RunDirError`, exit 2) naming it; a swap after that check
cannot redirect the write or delete, because the descriptor still names the directory that was checked. The top itself,
the directory the user named, is trusted, symlink or not. POSIX only (`os.supports_dir_fd`, `O_NOFOLLOW`); pure standard
library. The module imports everywhere, but Windows (no `dir_fd`) has no way to walk without following links.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from rl import platform
from rl.errors import LinkRefusedError
from rl.untrusted import shown

# getattr: the module must import where these flags do not exist (Windows), though a Tree needs them to work.
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_DIR = os.O_RDONLY | _DIRECTORY | _NOFOLLOW | _CLOEXEC
# Opening a FIFO to read blocks until a writer comes: O_NONBLOCK lets the type check below refuse it instead.
# O_NOCTTY: a terminal device planted at a file's name must not become this process's controlling terminal.
_PROBE = os.O_RDONLY | _NOFOLLOW | _CLOEXEC | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)
_MODES = {"r": os.O_RDONLY, "w": os.O_WRONLY | os.O_CREAT | os.O_TRUNC, "a": os.O_WRONLY | os.O_CREAT | os.O_APPEND}
_MODES["x"] = os.O_WRONLY | os.O_CREAT | os.O_EXCL
_WRITE = os.O_WRONLY | os.O_RDWR


class Tree:
    """The files below `top`, reached without following a symlink. Methods take paths under `top` (absolute, or
    relative to the current directory as `top` is)."""

    def __init__(self, top: str | os.PathLike[str], cloner: platform.Cloner = platform.CLONER) -> None:
        self.top = Path(os.path.abspath(top))
        self.cloner = cloner  # how `copy_file` clones (rl.platform.clone_at)

    def __repr__(self) -> str:
        return f"Tree({str(self.top)!r})"

    # -- walking -----------------------------------------------------------------------------------------------------

    def _parts(self, path: str | os.PathLike[str]) -> list[str]:
        p, top = os.path.abspath(path), str(self.top)
        if p == top:
            return []
        prefix = top if top.endswith(os.sep) else top + os.sep
        if not p.startswith(prefix):
            raise ValueError(f"{p} is not under {top}")
        return p[len(prefix) :].split(os.sep)

    def _refuse(self, parts: list[str], what: str) -> LinkRefusedError:
        path = shown(self.top.joinpath(*parts))
        return LinkRefusedError(
            f"{path} is {what}, so writing or deleting through it could reach outside {self.top}; a run directory "
            "someone sent you may be crafted, or something changed it while this command ran. Remove it (or use "
            "another directory) and retry"
        )

    def _open_at(self, dir_fd: int, parts: list[str], flags: int, mode: int = 0o666) -> int:
        """`openat(dir_fd, parts[-1], flags | O_NOFOLLOW)`, a symlink there refused by name."""
        try:
            return os.open(parts[-1], flags | _NOFOLLOW | _CLOEXEC, mode, dir_fd=dir_fd)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # a socket, or a FIFO opened to write with no reader
                raise self._refuse(parts, "a FIFO or socket, not a regular file") from None
            if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):  # EMLINK: FreeBSD's O_NOFOLLOW
                with contextlib.suppress(OSError):
                    if stat.S_ISLNK(os.stat(parts[-1], dir_fd=dir_fd, follow_symlinks=False).st_mode):
                        raise self._refuse(parts, "a symlink") from None
            raise

    def _open_dir(self, parts: list[str], *, create: bool = False) -> int:
        fd = os.open(self.top, os.O_RDONLY | _DIRECTORY | _CLOEXEC)
        if parts and (sub := platform.open_beneath(fd, os.sep.join(parts), _DIR)) is not None:
            os.close(fd)  # the whole path in one syscall, no link followed (Linux); otherwise the walk below
            return sub
        try:
            for i in range(len(parts)):
                if create:
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(parts[i], dir_fd=fd)
                sub = self._open_at(fd, parts[: i + 1], _DIR)
                os.close(fd)
                fd = sub
        except BaseException:
            os.close(fd)
            raise
        return fd

    @contextlib.contextmanager
    def directory(self, path: str | os.PathLike[str], *, create: bool = False) -> Iterator[int]:
        """A descriptor of the directory `path` (made with its parents when `create`), held for the block."""
        fd = self._open_dir(self._parts(path), create=create)
        try:
            yield fd
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def parent(self, path: str | os.PathLike[str], *, create: bool = False) -> Iterator[tuple[int, str]]:
        """(descriptor of `path`'s directory, `path`'s name in it), held for the block."""
        parts = self._parts(path)
        if not parts:
            raise ValueError(f"{self.top} is the tree's top: it has no entry name below the top")
        fd = self._open_dir(parts[:-1], create=create)
        try:
            yield fd, parts[-1]
        finally:
            os.close(fd)

    # -- files -------------------------------------------------------------------------------------------------------

    def open(self, path: str | os.PathLike[str], flags: int, mode: int = 0o666, *, create_parents: bool = False) -> int:
        """`os.open(path, flags | O_NOFOLLOW)` with every directory on the way opened without following links.

        Opened to write, `path` must be a regular file with one link (`_checked_for_write`): a hard link, FIFO,
        socket or device planted at that name is refused before a byte is written or truncated."""
        parts = self._parts(path)
        with self.parent(path, create=create_parents) as (dfd, _):
            if flags & _WRITE:
                return self._checked_for_write(dfd, parts, flags, mode)
            return self._open_at(dfd, parts, flags, mode)

    def _checked_for_write(self, dfd: int, parts: list[str], flags: int, mode: int) -> int:
        """Open without blocking (a FIFO would wait for a reader) and without truncating, check what was opened with
        `fstat`, then truncate: a hard link would carry the write to a file outside, a device or FIFO take it."""
        probe = getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)
        fd = self._open_at(dfd, parts, (flags & ~os.O_TRUNC) | probe, mode)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise self._refuse(parts, f"a {special_kind(st.st_mode)}, not a regular file")
            if st.st_nlink != 1:
                raise self._refuse(parts, f"a file with {st.st_nlink} hard links (one may be outside)")
            if flags & os.O_TRUNC:
                os.ftruncate(fd, 0)
            os.set_blocking(fd, True)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def open_regular(self, path: str | os.PathLike[str]) -> int:
        """A read-only descriptor of the regular file `path`; a FIFO, device or directory there is refused."""
        fd = self.open(path, _PROBE)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise self._refuse(self._parts(path), f"a {special_kind(st.st_mode)}, not a regular file")
            os.set_blocking(fd, True)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def open_file(
        self,
        path: str | os.PathLike[str],
        mode: str = "r",
        *,
        encoding: str | None = None,
        newline: str | None = None,
        perm: int = 0o666,
    ) -> IO[Any]:
        """`open(path, mode)` without following a link ("r", "w", "a", "x", each with "b" and "+")."""
        if mode.strip("bt+") == "r":
            fd = self.open_regular(path)
            if "+" in mode:
                os.close(fd)
                fd = self.open(path, os.O_RDWR)
        else:
            flags = _MODES[mode.strip("bt+")]
            if "+" in mode:
                flags = (flags & ~os.O_WRONLY) | os.O_RDWR
            fd = self.open(path, flags, perm)
        try:
            if "b" in mode:
                return open(fd, mode)
            return open(fd, mode, encoding=encoding or "utf-8", newline=newline)
        except BaseException:
            os.close(fd)
            raise

    def read_bytes(self, path: str | os.PathLike[str], *, limit: int | None = None) -> bytes:
        """The file's bytes; `OverflowError` when it holds more than `limit`, refused by its size before any is read
        (a sparse file claiming gigabytes costs nothing)."""
        fd = self.open_regular(path)
        with open(fd, "rb") as f:
            if limit is not None and os.fstat(fd).st_size > limit:
                raise OverflowError(f"{shown(path)} holds more than {limit} bytes")
            data = f.read() if limit is None else f.read(limit + 1)  # +1: a file that grew since the fstat
        if limit is not None and len(data) > limit:
            raise OverflowError(f"{shown(path)} holds more than {limit} bytes")
        return data

    def write_atomic(
        self, path: str | os.PathLike[str], data: bytes, *, tmp_name: str, perm: int = 0o644, durable: bool = False
    ) -> None:
        """Write `data` to a new file `tmp_name` beside `path`, then rename it over `path`: never half of it."""
        tmp = Path(path).with_name(tmp_name)
        parts = self._parts(tmp)
        with self.parent(path) as (dfd, name):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(
                    tmp_name, dir_fd=dfd
                )  # a file (or link) a killed writer left: we replace it, never through it
            fd = self._open_at(dfd, parts, os.O_WRONLY | os.O_CREAT | os.O_EXCL, perm)
            try:
                with open(fd, "wb") as f:
                    f.write(data)
                    if durable:
                        f.flush()
                        os.fsync(f.fileno())
                os.replace(tmp_name, name, src_dir_fd=dfd, dst_dir_fd=dfd)
            except BaseException:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp_name, dir_fd=dfd)
                raise

    def hash_file(self, path: str | os.PathLike[str], *, fsync: bool = False) -> str:
        with open(self.open_regular(path), "rb") as f:
            digest = hashlib.file_digest(f, "sha256").hexdigest()
            if fsync:
                os.fsync(f.fileno())
        return digest

    def copy_file(self, src: str | os.PathLike[str], dst: str | os.PathLike[str], *, reflink: bool) -> bool:
        """Create `dst` (which must not exist) with `src`'s bytes, cloned where `reflink` and the filesystem can
        (`rl.platform.clone_at`); True when it was cloned, False when its bytes were copied."""
        src_fd = self.open_regular(src)
        try:
            if reflink:
                with self.parent(dst) as (dfd, name):
                    if platform.clone_at(src_fd, dfd, name, self.cloner):
                        return True
            with (
                open(src_fd, "rb", closefd=False) as fsrc,
                open(self.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644), "wb") as fdst,
            ):
                shutil.copyfileobj(fsrc, fdst, 1 << 20)
        finally:
            os.close(src_fd)
        return False

    # -- entries -----------------------------------------------------------------------------------------------------

    def lstat(self, path: str | os.PathLike[str]) -> os.stat_result:
        if not self._parts(path):
            return os.stat(self.top)
        with self.parent(path) as (dfd, name):
            return os.stat(name, dir_fd=dfd, follow_symlinks=False)

    def kind(self, path: str | os.PathLike[str]) -> str | None:
        """ "dir", "file", "symlink" or "other"; None when nothing is there."""
        try:
            mode = self.lstat(path).st_mode
        except (FileNotFoundError, NotADirectoryError):
            return None
        if stat.S_ISDIR(mode):
            return "dir"
        if stat.S_ISREG(mode):
            return "file"
        return "symlink" if stat.S_ISLNK(mode) else "other"

    def listdir(self, path: str | os.PathLike[str]) -> list[str]:
        with self.directory(path) as fd:
            return sorted(os.listdir(fd))

    def mkdir(self, path: str | os.PathLike[str], *, parents: bool = False, exist_ok: bool = False) -> None:
        with self.parent(path, create=parents) as (dfd, name):
            try:
                os.mkdir(name, dir_fd=dfd)
            except FileExistsError:
                if not exist_ok:
                    raise
                self._open_dir_check(dfd, self._parts(path))

    def _open_dir_check(self, dfd: int, parts: list[str]) -> None:
        os.close(self._open_at(dfd, parts, _DIR))

    def unlink(self, path: str | os.PathLike[str], *, missing_ok: bool = False) -> None:
        """Remove a file or a symlink (never what it points to)."""
        with self.parent(path) as (dfd, name):
            try:
                os.unlink(name, dir_fd=dfd)
            except FileNotFoundError:
                if not missing_ok:
                    raise

    def replace(self, src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        """`os.replace(src, dst)`: each name relative to its own directory's descriptor."""
        with self.parent(src) as (sfd, sname), self.parent(dst) as (dfd, dname):
            os.replace(sname, dname, src_dir_fd=sfd, dst_dir_fd=dfd)

    def rename(self, src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        """`os.rename(src, dst)`: a directory moved onto a non-empty one fails (EEXIST, ENOTEMPTY)."""
        with self.parent(src) as (sfd, sname), self.parent(dst) as (dfd, dname):
            os.rename(sname, dname, src_dir_fd=sfd, dst_dir_fd=dfd)

    def link(self, src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        """A hard link `dst` to the file `src` (never to what a symlink at `src` points to)."""
        with self.parent(src) as (sfd, sname), self.parent(dst) as (dfd, dname):
            os.link(sname, dname, src_dir_fd=sfd, dst_dir_fd=dfd, follow_symlinks=False)

    def symlink(self, target: str, path: str | os.PathLike[str]) -> None:
        with self.parent(path) as (dfd, name):
            os.symlink(target, name, dir_fd=dfd)

    def readlink(self, path: str | os.PathLike[str]) -> str:
        with self.parent(path) as (dfd, name):
            return os.readlink(name, dir_fd=dfd)

    def chmod(self, path: str | os.PathLike[str], mode: int) -> None:
        """Change the mode of the file or directory `path`; a symlink there is refused, not followed."""
        fd = self.open(path, _PROBE)
        try:
            os.fchmod(fd, mode)
        finally:
            os.close(fd)

    def utime(self, path: str | os.PathLike[str], ns: tuple[int, int]) -> None:
        fd = self.open(path, _PROBE)
        try:
            os.utime(fd, ns=ns)
        finally:
            os.close(fd)

    def fsync_dir(self, path: str | os.PathLike[str]) -> None:
        with self.directory(path) as fd:
            os.fsync(fd)

    def walk(self, path: str | os.PathLike[str]) -> Iterator[tuple[str, str, os.stat_result]]:
        """(relpath, kind, lstat) for everything under the directory `path`, sorted, never following a symlink.
        kind is "file", "dir", "symlink" or what `special_kind` names."""
        with self.directory(path) as fd:
            yield from _walk_fd(fd, "")

    def rmtree(self, path: str | os.PathLike[str]) -> None:
        """Delete `path` and all below it, sealed (read-only) directories included; a symlink is unlinked, never
        followed; nothing there is fine."""
        with self.parent(path) as (dfd, name):
            _remove_at(dfd, name)


def write_new_at(dir_fd: int, rel: str, data: bytes, perm: int = 0o644) -> None:
    """Create the file `rel` (a checked relative path, its directories made as needed) below the held directory
    `dir_fd` and write `data`: every name created exclusively or opened without following a link, so this is for a
    directory this writer just made (a staging directory), where nothing else can be."""
    *dirs, name = rel.split("/")
    opened: list[int] = []
    try:
        fd = dir_fd
        for part in dirs:
            with contextlib.suppress(FileExistsError):
                os.mkdir(part, dir_fd=fd)
            fd = os.open(part, _DIR, dir_fd=fd)
            opened.append(fd)
        out = create_at(fd, name, perm)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(out, view) :]
        finally:
            os.close(out)
    finally:
        for fd in opened:
            os.close(fd)


def create_at(dir_fd: int, name: str, perm: int = 0o644) -> int:
    """A new file `name` in the held directory `dir_fd`, open to write: created here (O_EXCL), never through a link."""
    return os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, perm, dir_fd=dir_fd)


def open_dir_at(dir_fd: int, name: str) -> int:
    """A descriptor of the directory `name` in the held directory `dir_fd`; a symlink there is not followed."""
    return os.open(name, _DIR, dir_fd=dir_fd)


def _walk_fd(fd: int, prefix: str) -> Iterator[tuple[str, str, os.stat_result]]:
    with os.scandir(fd) as it:
        entries = sorted(it, key=lambda e: e.name)
    for entry in entries:
        rel = f"{prefix}{entry.name}"
        st = entry.stat(follow_symlinks=False)
        if stat.S_ISLNK(st.st_mode):
            yield rel, "symlink", st
        elif stat.S_ISDIR(st.st_mode):
            yield rel, "dir", st
            try:
                sub = os.open(entry.name, _DIR, dir_fd=fd)
            except OSError as exc:  # swapped for a link since the scan
                raise LinkRefusedError(
                    f"{rel} changed while it was read ({exc}); retry once nothing else writes it"
                ) from None
            try:
                yield from _walk_fd(sub, f"{rel}/")
            finally:
                os.close(sub)
        elif stat.S_ISREG(st.st_mode):
            yield rel, "file", st
        else:
            yield rel, special_kind(st.st_mode), st


def special_kind(mode: int) -> str:
    kinds = ((stat.S_ISFIFO, "FIFO"), (stat.S_ISSOCK, "socket"), (stat.S_ISCHR, "character device"))
    for test, kind in (*kinds, (stat.S_ISDIR, "directory")):
        if test(mode):
            return kind
    return "block device" if stat.S_ISBLK(mode) else "special file"


def _remove_at(dfd: int, name: str) -> None:
    try:
        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=dfd)
        return
    try:
        fd = os.open(name, _DIR, dir_fd=dfd)
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
        os.unlink(name, dir_fd=dfd)  # became a link since the stat: remove the link, not its target
        return
    try:
        if stat.S_IMODE(os.fstat(fd).st_mode) & 0o700 != 0o700:
            os.fchmod(fd, 0o700)  # a sealed (0555) directory: its entries cannot be removed otherwise
        for child in os.listdir(fd):
            _remove_at(fd, child)
    finally:
        os.close(fd)
    with contextlib.suppress(FileNotFoundError):
        os.rmdir(name, dir_fd=dfd)
