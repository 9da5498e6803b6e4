"""The platform layer (`rl.platform`): each fallback forced on Linux, Windows refused in one line, and no module of `rl`
outside that layer importing a POSIX-only module at module level (macOS lacks some, Windows all of them)."""

from __future__ import annotations

import ast
import ctypes
import errno
import functools
import os
import shutil
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from parsed_sources import parsed

import rl
from rl import platform
from rl.storage.dead_writers import discard_if_dead, locked_new_dir
from rl.storage.safe_fs import Tree
from rl.storage.volumes import LocalVolumeStore
from rl.storage.volumes.filesystem import probe_share_mode, try_reflink

RL_ROOT = Path(rl.__file__).parent
REPO = RL_ROOT.parent
# Standard-library modules that exist on POSIX only (some not on macOS either), and Windows-only ones.
OS_SPECIFIC_MODULES = frozenset(
    {"fcntl", "termios", "tty", "pty", "resource", "pwd", "grp", "posix", "syslog", "crypt", "spwd", "nis"}
    | {"ossaudiodev", "msvcrt", "winreg", "winsound", "_winapi", "nt"}
)


def _module_level_imports(tree: ast.Module) -> list[str]:
    """Top-level module names imported outside any function or class body (an `if`/`try` at module level counts)."""
    found: list[str] = []
    pending: list[ast.AST] = list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, ast.Import):
            found += [alias.name.split(".")[0] for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append(node.module.split(".")[0])
        elif not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda):
            pending += list(ast.iter_child_nodes(node))
    return found


def test_no_module_outside_the_platform_layer_imports_an_os_specific_module_at_module_level():
    """Every module of rl but rl/platform.py imports fcntl, termios, pwd, msvcrt, ... only inside functions."""
    offenders = {}
    for path in sorted(RL_ROOT.rglob("*.py")):
        if path == RL_ROOT / "platform.py":
            continue
        names = set(_module_level_imports(parsed(path))) & OS_SPECIFIC_MODULES
        if names:
            offenders[str(path.relative_to(REPO))] = sorted(names)
    assert offenders == {}


def test_the_import_scan_sees_imports_nested_in_module_level_blocks_but_not_in_functions():
    """The scan above finds `import fcntl` under a module-level try/if, and ignores one inside a function."""
    source = "try:\n    import fcntl\nexcept ImportError:\n    pass\nif True:\n    from termios import x\n"
    source += "def f():\n    import pwd\n"
    assert sorted(_module_level_imports(ast.parse(source))) == ["fcntl", "termios"]


@pytest.mark.parametrize("name", ["win32", "cygwin"])
def test_windows_is_refused_at_import_in_one_line_that_says_to_use_wsl(name):
    """`import rl` on Windows raises ImportError whose single-line message names WSL."""
    with pytest.raises(ImportError) as caught:
        platform.refuse_unsupported(name)
    message = str(caught.value)
    assert "WSL" in message and "\n" not in message and name in message


@pytest.mark.parametrize("name", ["linux", "darwin"])
def test_linux_and_macos_are_not_refused(name):
    """The supported platforms import."""
    platform.refuse_unsupported(name)


@pytest.mark.parametrize(
    ("system", "version"), [("Linux", "2.13.0+cpu"), ("Darwin", "2.13.0")], ids=["linux-cpu-label", "macos-plain"]
)
def test_the_cpu_constraints_pin_one_torch_per_platform(system, version):
    """constraints/cpu.txt pins the `+cpu` build on Linux and PyPI's plain (CPU) wheel on macOS, exactly one each."""
    pins = [
        str(req.specifier)
        for line in (REPO / "constraints/cpu.txt").read_text().splitlines()
        if line.startswith("torch")
        for req in [Requirement(line)]
        if req.marker is not None and req.marker.evaluate({"platform_system": system, "sys_platform": system.lower()})
    ]
    assert pins == [f"=={version}"]


@pytest.mark.parametrize("cloner", ["none", "clonefile", "ficlone"])
def test_a_clone_the_platform_cannot_make_leaves_no_file_and_the_store_links_instead(tmp_path, cloner):
    """Forced to each clone backend on a filesystem without reflinks (clonefile: no such call in Linux's libc),
    try_reflink says False, leaves no destination, and the store falls back to hard links."""
    if cloner == "ficlone" and platform.CLONE == "ficlone" and probe_share_mode(tmp_path) == "reflink":
        pytest.skip("this filesystem reflinks: FICLONE succeeds here")
    forced = platform.CLONERS[cloner]
    src = tmp_path / "src"
    src.write_bytes(b"bytes")
    assert try_reflink(src, tmp_path / "dst", forced) is False
    assert not (tmp_path / "dst").exists()
    assert probe_share_mode(tmp_path, forced) == "hardlink"
    assert LocalVolumeStore(tmp_path / "store", cloner=forced).share_mode == "hardlink"


def test_a_clone_never_replaces_or_removes_an_existing_destination(tmp_path):
    """clone_at refuses an existing name (FileExistsError) and leaves its bytes: a failed clone removes only what it
    made itself."""
    src = tmp_path / "src"
    src.write_bytes(b"new")
    (tmp_path / "dst").write_bytes(b"someone else's")
    with pytest.raises(FileExistsError):
        platform.clone_file(src, tmp_path / "dst")
    assert (tmp_path / "dst").read_bytes() == b"someone else's"


def test_without_clones_or_hard_links_the_store_copies_and_forks_stay_independent(tmp_path, monkeypatch):
    """With no clone and `os.link` refused (EPERM, as on a filesystem without hard links), the store probes "copy"
    and a fork's write leaves its parent's bytes alone."""

    def no_link(*args, **kwargs):
        raise OSError(errno.EPERM, "hard links not supported")

    monkeypatch.setattr(os, "link", no_link)
    store = LocalVolumeStore(tmp_path / "store", cloner=platform.CLONERS["none"])
    assert store.share_mode == "copy"
    _assert_forks_are_independent(store)


def test_where_the_clone_succeeds_the_store_uses_it_and_forks_stay_independent(tmp_path):
    """The reflink path of the store, run on Linux without a reflinking filesystem: a stand-in clone that makes an
    independent file with the same bytes (what FICLONE and clonefile promise), refusing an existing destination."""

    def clone_by_copy(src_fd: int, dir_fd: int, name: str) -> bool:
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644, dir_fd=dir_fd)
        with open(src_fd, "rb", closefd=False) as fsrc, open(fd, "wb") as fdst:
            shutil.copyfileobj(fsrc, fdst)
        return True

    store = LocalVolumeStore(tmp_path / "store", cloner=clone_by_copy)
    assert store.share_mode == "reflink"
    _assert_forks_are_independent(store)


def _assert_forks_are_independent(store: LocalVolumeStore) -> None:
    rw = store.new("world")
    with rw:
        rw.write_bytes("docs/a.txt", b"parent")
        parent = rw.finalize("parent")
    child = parent.fork("child")
    with child:
        assert (child.mount() / "docs/a.txt").read_bytes() == b"parent"
        child.write_bytes("docs/a.txt", b"child")
        version = child.finalize("child")
    assert (parent.path() / "docs/a.txt").read_bytes() == b"parent"
    assert (version.path() / "docs/a.txt").read_bytes() == b"child"


def test_without_flock_writers_go_on_unlocked_and_cleaners_leave_their_entries(tmp_path):
    """Forced onto a platform without flock, flock raises OSError (as an NFS mount that refuses it): a writer still
    gets its staging directory, and a cleaner, unable to tell whether its writer lives, never deletes it."""
    no_flock = functools.partial(platform.flock, available=False)
    with pytest.raises(OSError):
        no_flock(0)
    counter = iter(range(10))
    fs = Tree(tmp_path)
    with locked_new_dir(lambda: tmp_path / f"stage-{next(counter)}", fs, no_flock) as stage:
        assert stage.is_dir()
    assert discard_if_dead(stage, fs, no_flock) is False
    assert stage.is_dir()


def test_bytes_written_is_none_where_the_platform_does_not_count_them(tmp_path, monkeypatch):
    """Linux counts this process's written bytes; where /proc/self/io is missing (macOS) the figure is None."""
    if Path(platform.PROC_SELF_IO).exists():
        before = platform.bytes_written()
        (tmp_path / "f").write_bytes(b"x" * 4096)
        after = platform.bytes_written()
        assert before is not None and after is not None and after - before >= 4096
    monkeypatch.setattr(platform, "PROC_SELF_IO", str(tmp_path / "no-such-proc-io"))
    assert platform.bytes_written() is None


def test_open_beneath_opens_a_plain_path_in_one_call_and_refuses_links_and_escapes(tmp_path):
    """openat2 (Linux 5.6+) or None; None means the caller walks the path and names what it met."""
    (tmp_path / "top" / "a" / "b").mkdir(parents=True)
    (tmp_path / "top" / "link").symlink_to(tmp_path / "top" / "a")
    (tmp_path / "top" / "a" / "up").symlink_to(tmp_path)
    top = os.open(tmp_path / "top", os.O_RDONLY | os.O_DIRECTORY)
    flags = os.O_RDONLY | os.O_DIRECTORY
    try:
        fd = platform.open_beneath(top, "a/b", flags)
        if platform.OPENAT2 is None:
            pytest.skip("this kernel or sandbox has no openat2: the walk is all there is (tests/test_link_swaps.py)")
        assert fd is not None and os.path.samestat(os.fstat(fd), os.stat(tmp_path / "top" / "a" / "b"))
        os.close(fd)
        for refused in ("link/b", "link", "a/up", "a/../..", "a/missing"):
            assert platform.open_beneath(top, refused, flags) is None, refused
        assert platform.OPENAT2 is not None  # a refusal is not a missing syscall
    finally:
        os.close(top)


def test_a_platform_without_openat2_is_found_once_and_walked_from_then_on(tmp_path, monkeypatch):
    calls = []

    def refused(*args):
        calls.append(args)
        ctypes.set_errno(errno.ENOSYS)
        return -1

    monkeypatch.setattr(platform, "OPENAT2", refused)
    (tmp_path / "a" / "b").mkdir(parents=True)
    tree = Tree(tmp_path)
    for _ in range(2):
        tree.write_atomic(tmp_path / "a" / "b" / "f", b"x", tmp_name="f.tmp")
    assert len(calls) == 1 and platform.OPENAT2 is None
    assert (tmp_path / "a" / "b" / "f").read_bytes() == b"x"
