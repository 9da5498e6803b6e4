"""A converted model in the cache, checked by content on each use, and the staging it is built in, never left behind.

At conversion every file is fsynced and hashed into `rl-manifest.json` (sha256, size), written last and atomically,
then the directory is published by one rename. On each use `verified_copy` reads each file once, through a descriptor
opened without following links, hashing it as it copies it into a private directory of this process (0700, beside the
cache): the copy is what loads, so a file swapped after the check cannot reach the model. A file that differs, is
missing or extra ends in `ModelCacheError` naming it. With `RL_RUN_KEY` set the manifest is sealed (HMAC-SHA256);
without it, it catches a swap and damage, not a forged manifest (docs/guarantees.md#a-model-directory).

Staging directories and private copies hold a `rl.storage.dead_writers` lock while their process lives (`discard_stale`
deletes the others); `removed_on_sigterm` turns SIGTERM into an exception while converting, then re-delivers it.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import hmac
import json
import os
import re
import secrets
import signal
import stat
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rl.errors import ModelCacheError, RunDirError, UntrustedValueError, shown
from rl.storage.dead_writers import discard_if_dead, locked_new_dir_at
from rl.storage.safe_fs import Tree, create_at
from rl.untrusted import parse_json

__all__ = [
    "MANIFEST_FILE",
    "PRIVATE_PREFIX",
    "STAGING_PREFIX",
    "copied_from",
    "discard_stale",
    "removed_on_sigterm",
    "verified_copy",
    "write_manifest",
]

MANIFEST_FILE = "rl-manifest.json"
STAGING_PREFIX = ".staging-"
PRIVATE_PREFIX = ".verified-"
RUN_KEY_ENV = "RL_RUN_KEY"  # the key that seals checkpoints (rl.storage.checkpoint.format) seals manifests too
MAX_MANIFEST_BYTES = 1 << 20
MAX_FILES = 256
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")  # what save_pretrained writes: flat, plain names
_HEX64 = re.compile(r"[0-9a-f]{64}")
_CHUNK = 1 << 20


def _fix(target: Path) -> str:
    return f"delete {shown(target)} and run again to convert it anew, and make sure only you can write there"


def _seal(key: str, files: dict[str, Any]) -> str:
    body = json.dumps(files, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()
    return hmac.new(key.encode(), b"rl-model-cache:1:" + body, hashlib.sha256).hexdigest()


def write_manifest(model_dir: Path) -> None:
    """Hash and fsync every file of `model_dir` (flat, regular files only), then write the manifest last, atomically."""
    fs = Tree(model_dir)
    files: dict[str, dict[str, Any]] = {}
    for name in sorted(fs.listdir(model_dir)):
        if fs.kind(model_dir / name) != "file" or not _NAME.fullmatch(name):
            raise ModelCacheError(f"the conversion wrote {shown(name)}, not a plain file; {_fix(model_dir)}")
        files[name] = {"sha256": fs.hash_file(model_dir / name, fsync=True), "size": fs.lstat(model_dir / name).st_size}
    doc: dict[str, Any] = {"format": 1, "files": files}
    key = os.environ.get(RUN_KEY_ENV)
    if key:
        doc["seal"] = _seal(key, files)
    body = (json.dumps(doc, indent=1, sort_keys=True, allow_nan=False) + "\n").encode()
    fs.write_atomic(model_dir / MANIFEST_FILE, body, tmp_name=f".{MANIFEST_FILE}.tmp", durable=True)
    fs.fsync_dir(model_dir)


def has_manifest(target: Path) -> bool:
    """Whether `target` was published with a manifest (a conversion of this version), whatever its state now."""
    try:
        return Tree(target.parent).kind(target / MANIFEST_FILE) is not None
    except (OSError, RunDirError):
        return False


def _manifest(target: Path) -> dict[str, dict[str, Any]]:
    """The manifest's files, checked against its schema (and its seal, with RL_RUN_KEY set)."""
    where = f"{shown(target / MANIFEST_FILE)}"
    try:
        doc = parse_json(Tree(target).read_bytes(target / MANIFEST_FILE, limit=MAX_MANIFEST_BYTES))
    except (OSError, OverflowError, RunDirError, UntrustedValueError) as exc:
        raise ModelCacheError(f"{where} cannot be read ({shown(exc)}); {_fix(target)}") from exc
    files = doc.get("files") if isinstance(doc, dict) and doc.get("format") == 1 else None
    if not isinstance(files, dict) or not 0 < len(files) <= MAX_FILES:
        raise ModelCacheError(f"{where} is not a manifest this tool writes; {_fix(target)}")
    for name, entry in files.items():
        ok = isinstance(entry, dict) and set(entry) == {"sha256", "size"}
        ok = ok and _NAME.fullmatch(name) is not None and name != MANIFEST_FILE
        ok = ok and isinstance(entry["sha256"], str) and _HEX64.fullmatch(entry["sha256"]) is not None
        if not (ok and type(entry["size"]) is int and entry["size"] >= 0):
            raise ModelCacheError(f"{where} has a malformed entry {shown(name)}; {_fix(target)}")
    key = os.environ.get(RUN_KEY_ENV)
    if key:
        found = doc.get("seal")
        if not isinstance(found, str) or not hmac.compare_digest(found, _seal(key, files)):
            raise ModelCacheError(
                f"{where} is not sealed under RL_RUN_KEY (converted without the key, under another, or forged); "
                f"{_fix(target)}"
            )
    return files


_COPIES: dict[tuple[str, bytes, tuple[Any, ...]], Path] = {}  # (target, manifest, files' stat) -> a checked copy
_HELD = contextlib.ExitStack()  # the copies' dead-writer locks, held until the process exits
_LOCK = threading.Lock()


def verified_copy(target: Path) -> Path:
    """A private copy of the converted model `target`, every file checked against the manifest while copied.

    Raises `ModelCacheError` (one line, naming the file) when a file is missing, extra, of another size or digest,
    or not a regular file. Within one process the copy is made once per manifest; it is deleted at exit."""
    target = Path(target).absolute()
    files = _manifest(target)
    fs = Tree(target)
    with _LOCK:
        present = set(fs.listdir(target)) - {MANIFEST_FILE}
        memo = (str(target), _digest(files), _stats(fs, target, present))
        if memo in _COPIES:
            return _COPIES[memo]
        extra, missing = sorted(present - set(files)), sorted(set(files) - present)
        if extra or missing:
            name, how = (extra[0], "is not in") if extra else (missing[0], "is missing, named by")
            raise ModelCacheError(f"{shown(target / name)} {how} the manifest written at conversion; {_fix(target)}")
        root = target.parent
        with Tree(root).directory(root) as root_fd:
            made = _HELD.enter_context(locked_new_dir_at(root_fd, lambda: _private_name(target.name)))
        copy = root / made[0]
        try:
            os.fchmod(made[1], 0o700)
            for name, entry in sorted(files.items()):
                _copy_checked(fs, target / name, entry, made[1], name, target)
        except BaseException:
            Tree(root).rmtree(copy)
            raise
        _COPIES[memo] = copy
        return copy


def _digest(files: dict[str, Any]) -> bytes:
    return hashlib.sha256(json.dumps(files, sort_keys=True, allow_nan=False).encode()).digest()


def _stats(fs: Tree, target: Path, names: set[str]) -> tuple[Any, ...]:
    """What a swap or a write changes (the inode, its size, mtime and ctime): a second use in one process copies
    again when any differs."""
    keys = []
    for name in sorted(names):
        st = fs.lstat(target / name)
        keys.append((name, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
    return tuple(keys)


def _private_name(cache_name: str) -> str:
    return f"{PRIVATE_PREFIX}{cache_name}-{os.getpid()}-{secrets.token_hex(4)}"


def _copy_checked(fs: Tree, path: Path, entry: dict[str, Any], copy_fd: int, name: str, target: Path) -> None:
    """Copy `path` into the directory `copy_fd`, hashing what is read; refuse a size or digest the manifest lacks."""
    try:
        src = fs.open_regular(path)
    except (OSError, RunDirError) as exc:
        raise ModelCacheError(f"{shown(path)} cannot be opened as a file ({shown(exc)}); {_fix(target)}") from exc
    with open(src, "rb") as f, open(create_at(copy_fd, name, 0o400), "wb") as out:
        st = os.fstat(src)
        if not stat.S_ISREG(st.st_mode) or st.st_size != entry["size"]:
            raise ModelCacheError(
                f"{shown(path)} holds {st.st_size} bytes, not the {entry['size']} the manifest written at "
                f"conversion records; {_fix(target)}"
            )
        digest, copied = hashlib.sha256(), 0
        while copied <= entry["size"]:  # one byte past the size: a file that grew while read is refused below
            chunk = f.read(min(_CHUNK, entry["size"] + 1 - copied))
            if not chunk:
                break
            digest.update(chunk)
            out.write(chunk)
            copied += len(chunk)
    if digest.hexdigest() != entry["sha256"] or copied != entry["size"]:
        raise ModelCacheError(
            f"{shown(path)} differs from the manifest written at conversion (sha256 {digest.hexdigest()[:16]}…, "
            f"not {entry['sha256'][:16]}…): the converted cache was changed or swapped; {_fix(target)}"
        )


def copied_from(path: Path) -> Path:
    """The cache directory a checked copy of this process was made from (what a user can find), else `path`."""
    with _LOCK:
        return next((Path(memo[0]) for memo, copy in _COPIES.items() if copy == Path(path)), Path(path))


@atexit.register
def _remove_copies() -> None:
    with _LOCK:
        for copy in _COPIES.values():
            with contextlib.suppress(OSError, RunDirError):
                Tree(copy.parent).rmtree(copy)
        _COPIES.clear()
        _HELD.close()


def discard_stale(root: Path) -> list[str]:
    """Delete the staging directories and private copies under the cache `root` whose process died; the names."""
    fs, gone = Tree(root), []
    try:
        names = fs.listdir(root)
    except (OSError, RunDirError):
        return []
    for name in names:
        if name.startswith((STAGING_PREFIX, PRIVATE_PREFIX)):
            with contextlib.suppress(OSError, RunDirError):
                if discard_if_dead(root / name, fs):
                    gone.append(name)
    return gone


class _Terminated(BaseException):
    """SIGTERM arrived during a conversion: unwinds it (its staging is removed), then the signal is re-delivered."""


@contextlib.contextmanager
def removed_on_sigterm() -> Iterator[None]:
    """Run the body with SIGTERM turned into an exception (so its `finally` cleanups run), then restore the previous
    handler and re-deliver the signal. Outside the main thread (no handler can be set) the body runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminated(signum: int, frame: object) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not cut the cleanup short
        raise _Terminated

    previous = signal.signal(signal.SIGTERM, terminated)
    try:
        yield
    except _Terminated:
        signal.signal(signal.SIGTERM, previous)
        signal.raise_signal(signal.SIGTERM)  # dies as it would have, its staging gone
        raise SystemExit(128 + signal.SIGTERM) from None  # a previous Python handler that returned
    finally:
        signal.signal(signal.SIGTERM, previous)
