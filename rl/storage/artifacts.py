"""Directory-like artifacts on the local filesystem, content-addressed (the `flyte.io.Dir` role for the CPU stack).

Under `root`: `objects/<hex>/...`, one immutable directory per distinct content, named by its sha256 digest;
`refs/<name>`, the digest most recently stored under a human name (for people, not lookups); `tmp/`, staging.

An artifact is a mapping of relative POSIX paths to bytes. Its digest is `sha256:` + sha256 over, for each path in
sorted order, the path, a NUL, the content length (8 bytes, big-endian) and the content: length-prefixing makes the
encoding unambiguous. Lookups go by digest, never by URI, so a ref stays valid wherever the same bytes are stored.
Every read re-hashes what it read, so a file changed on disk after it was written raises `ArtifactCorruptError`
instead of silently feeding a sampler or trainer the wrong weights. Pure standard library: importable without torch.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path, PurePosixPath

from rl.errors import ArtifactCorruptError, ArtifactNotFoundError, InvalidArtifactError, shown
from rl.protocols import Artifacts
from rl.storage.dead_writers import discard_if_dead, lock_at, locked_new_dir_at
from rl.storage.safe_fs import Tree, create_at, write_new_at
from rl.types import ArtifactRef

DIGEST_PREFIX = "sha256:"
_HEX = re.compile(r"[0-9a-f]{64}")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")
# What a writer leaves in tmp/ while it works: a staging directory, a ref being written, a corrupt object being deleted.
_TEMP = re.compile(r"(ref-|corrupt-)?[0-9a-f]{32}")


def _check_rel_path(path: str) -> str:
    if (
        not isinstance(path, str)
        or not path
        or path.startswith("/")
        or "\\" in path
        or "\0" in path
        or any(p in ("", ".", "..") for p in path.split("/"))
    ):
        raise InvalidArtifactError(
            f"artifact path {path!r} is not a plain relative POSIX path; use names like 'adapter_model.safetensors' "
            "or 'sub/dir/file', without '..', '.', empty components, backslashes or a leading '/'"
        )
    return path


def validate_files(files: Mapping[str, bytes]) -> dict[str, bytes]:
    """A checked copy of `files`: relative POSIX paths, bytes-like contents, no path both a file and a directory."""
    out: dict[str, bytes] = {}
    for path, content in files.items():
        _check_rel_path(path)
        if not isinstance(content, bytes | bytearray | memoryview):
            raise InvalidArtifactError(
                f"artifact file {path!r} holds a {type(content).__name__}, not bytes; encode it first "
                "(e.g. json.dumps(...).encode())"
            )
        out[path] = bytes(content)
    for path in out:
        parents = PurePosixPath(path).parents
        for parent in list(parents)[:-1]:  # the last parent is '.'
            if str(parent) in out:
                raise InvalidArtifactError(
                    f"artifact path {str(parent)!r} is a file but {path!r} needs it to be a directory"
                )
    return out


def compute_digest(files: Mapping[str, bytes]) -> str:
    """`sha256:<hex>` over sorted relative paths and contents (the encoding is described in the module docstring)."""
    h = hashlib.sha256()
    for path in sorted(files):
        content = files[path]
        h.update(path.encode("utf-8"))
        h.update(b"\0")
        h.update(len(content).to_bytes(8, "big"))
        h.update(content)
    return DIGEST_PREFIX + h.hexdigest()


def read_dir(path: Path) -> dict[str, bytes]:
    """Every regular file under `path`, keyed by relative POSIX path. Symlinks are refused (they escape the tree)."""
    path = Path(path)
    if not path.is_dir():
        raise InvalidArtifactError(
            f"{path} is not a directory; pass the directory to store (e.g. a PEFT adapter's output)"
        )
    files: dict[str, bytes] = {}
    for p in sorted(path.rglob("*")):
        if p.is_symlink():
            raise InvalidArtifactError(f"{p} is a symlink; artifacts hold plain files only, copy the target in instead")
        if p.is_file():
            files[p.relative_to(path).as_posix()] = p.read_bytes()
    return files


def write_files(files: Mapping[str, bytes], dest_dir: Path) -> Path:
    """Write `files` under `dest_dir` (created if absent; existing files with other names are left alone)."""
    files = validate_files(files)
    dest_dir = Path(dest_dir)
    dest_dir.mkdir(parents=True, exist_ok=True)
    for rel, content in files.items():
        target = dest_dir / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)
    return dest_dir


def _hex_of(ref: ArtifactRef) -> str:
    digest = ref.digest
    hex_digest = digest[len(DIGEST_PREFIX) :] if isinstance(digest, str) else ""
    if not (_HEX.fullmatch(hex_digest) and digest.startswith(DIGEST_PREFIX)):
        raise InvalidArtifactError(
            f"artifact digest {digest!r} is not of the form 'sha256:<64 lowercase hex>'; "
            "pass a ref returned by LocalArtifacts.put or put_dir"
        )
    return hex_digest


class LocalArtifacts:
    """The `Artifacts` protocol on a local directory: content-addressed, atomic writes, copy-on-read.

    Fault model: a crash mid-`put` leaves only a staging directory under `tmp/` (never a partial object), because an
    object appears by a single `rename`. Two writers putting the same content race harmlessly (one rename wins; the
    other's bytes were identical). Files edited on disk are detected at read time (`ArtifactCorruptError`); `put` of the
    same content repairs a corrupted object.
    """

    def __init__(self, root: Path) -> None:
        self.root = Path(os.path.abspath(root))  # refs are file:// URIs, which only an absolute path has
        self._objects = self.root / "objects"
        self._refs = self.root / "refs"
        self._tmp = self.root / "tmp"
        # From the store's own directory down, nothing is reached through a link (rl.storage.safe_fs): a folder swapped
        # for a symlink mid-run cannot carry objects, refs or deletes outside the store.
        self.fs = Tree(self.root.parent)
        self.root.parent.mkdir(parents=True, exist_ok=True)
        for d in (self._objects, self._refs, self._tmp):
            if self.fs.kind(d) is None:
                self.fs.mkdir(d, parents=True, exist_ok=True)
            if self.fs.kind(d) == "symlink":
                # Objects are read, refs written and tmp emptied through these: a link would take them elsewhere.
                raise ArtifactCorruptError(
                    f"{d} is a symlink, so the artifact store would read, write and delete wherever it points; a "
                    "store's directories are its own. Remove the link (or use a store this tool built) and retry"
                )

    def __repr__(self) -> str:
        return f"LocalArtifacts({str(self.root)!r})"

    def _object_dir(self, hex_digest: str) -> Path:
        return self._objects / hex_digest

    def _ref_for(self, hex_digest: str) -> ArtifactRef:
        return ArtifactRef(uri=self._object_dir(hex_digest).as_uri(), digest=DIGEST_PREFIX + hex_digest)

    def _read_verified(self, ref: ArtifactRef) -> dict[str, bytes]:
        hex_digest = _hex_of(ref)
        obj = self._object_dir(hex_digest)
        kind = self.fs.kind(obj)
        if kind == "symlink":
            raise ArtifactCorruptError(
                f"artifact {ref.digest} in {self.root} is a symlink to {shown(self.fs.readlink(obj))}, so reading it "
                "could read files outside the store; delete the link and put the artifact again (or rerun the step "
                "that made it)"
            )
        if kind != "dir":
            raise ArtifactNotFoundError(
                f"no artifact {ref.digest} in {self.root} (ref uri {ref.uri}); store it here with put/put_dir first, "
                "or open the store that produced the ref"
            )
        # Hashed as a stream first: a file grown (or a sparse one claiming gigabytes) is refused before it is read.
        actual, sizes = self._stream_digest(obj)
        if actual == ref.digest:
            files = self._read_object(obj, sizes)
            actual = compute_digest(files)  # what was read, in case a file changed since it was hashed
        if actual != ref.digest:
            raise ArtifactCorruptError(
                f"artifact {ref.digest} in {obj} now hashes to {actual}: its files were changed on disk. "
                "Put the original content again to repair it, or regenerate the artifact (e.g. rerun the step that "
                "produced it)"
            )
        return files

    async def put(self, files: Mapping[str, bytes], *, name: str) -> ArtifactRef:
        """Store `files` (relative POSIX path -> bytes) and return its ref; idempotent for equal content."""
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise InvalidArtifactError(
                f"artifact name {name!r} must be 1-200 characters of letters, digits, '.', '_' or '-', "
                "starting with a letter or digit (e.g. 'adapter-v3')"
            )
        checked = validate_files(files)
        ref = self._ref_for(_hex_of(ArtifactRef(uri="", digest=compute_digest(checked))))
        obj = self._object_dir(_hex_of(ref))
        # tmp/ held for the whole put: the staging directory and the ref's temp file are made in it by name, so each
        # step is one call, not a walk from the top (a put was 64 calls; a step stores two).
        with self.fs.directory(self._tmp) as tmp_fd:
            if self.fs.kind(obj) == "dir":
                try:
                    self._read_verified(ref)
                except ArtifactCorruptError:
                    self._replace(obj, checked, tmp_fd)
            else:
                self._install(obj, checked, tmp_fd)
            self._write_ref(name, ref.digest, tmp_fd)
        return ref

    @contextlib.contextmanager
    def _stage(self, files: Mapping[str, bytes], tmp_fd: int) -> Iterator[Path]:
        # Locked while this writer lives, so discard_abandoned deletes it only once the writer is dead.
        with locked_new_dir_at(tmp_fd, lambda: uuid.uuid4().hex) as (name, staging_fd):
            for rel, content in files.items():
                write_new_at(staging_fd, rel, content)
            yield self._tmp / name

    def _object_files(self, obj: Path) -> list[str]:
        """The relative paths of an object's files, in digest order; anything but files and directories refused."""
        rels = []
        for rel, kind, _ in self.fs.walk(obj):
            if kind == "file":
                rels.append(rel)
            elif kind != "dir":
                raise ArtifactCorruptError(
                    f"{shown(obj / rel)} is a {kind}; an artifact holds plain files only, and following a link could "
                    "read outside the store. Put the artifact again (or rerun the step that made it)"
                )
        return sorted(rels)

    def _stream_digest(self, obj: Path) -> tuple[str, dict[str, int]]:
        """`compute_digest` of an object's files read in 1 MiB chunks (memory bounded whatever they hold), and each
        file's size as hashed."""
        h, sizes = hashlib.sha256(), {}
        for rel in self._object_files(obj):
            with open(self.fs.open_regular(obj / rel), "rb") as f:
                size = os.fstat(f.fileno()).st_size
                h.update(rel.encode("utf-8") + b"\0" + size.to_bytes(8, "big"))
                done = 0
                while done <= size and (chunk := f.read(1 << 20)):
                    h.update(chunk)
                    done += len(chunk)
            sizes[rel] = size if done == size else -1  # changed while hashed: the digest cannot match
            if done != size:
                h.update(b"\0changed")
        return DIGEST_PREFIX + h.hexdigest(), sizes

    def _read_object(self, obj: Path, sizes: dict[str, int]) -> dict[str, bytes]:
        """Every regular file of an object, each no larger than it was hashed; never through a link."""
        files: dict[str, bytes] = {}
        for rel in self._object_files(obj):
            try:
                files[rel] = self.fs.read_bytes(obj / rel, limit=max(sizes.get(rel, 0), 0))
            except OverflowError:
                files[rel] = b""  # grown since it was hashed: the digest check below refuses it
        return files

    def _install(self, obj: Path, files: Mapping[str, bytes], tmp_fd: int) -> None:
        with self._stage(files, tmp_fd) as staging:
            try:
                self.fs.rename(staging, obj)
            except OSError:
                # Another writer installed the same digest first; its content is identical by construction.
                self.fs.rmtree(staging)
                if self.fs.kind(obj) != "dir":
                    raise

    def _replace(self, obj: Path, files: Mapping[str, bytes], tmp_fd: int) -> None:
        with self._stage(files, tmp_fd) as staging:
            trash = self._tmp / f"corrupt-{uuid.uuid4().hex}"
            self.fs.rename(obj, trash)
            self.fs.rename(staging, obj)
            self.fs.rmtree(trash)

    def _write_ref(self, name: str, digest: str, tmp_fd: int) -> None:
        while True:
            tmp = f"ref-{uuid.uuid4().hex}"
            fd = create_at(tmp_fd, tmp)
            if lock_at(fd, tmp_fd, tmp):
                break
            os.close(fd)
        with open(fd, "w") as f:
            f.write(digest + "\n")
            f.flush()
            with self.fs.directory(self._refs) as refs_fd:
                os.replace(tmp, name, src_dir_fd=tmp_fd, dst_dir_fd=refs_fd)

    def discard_abandoned(self) -> list[str]:
        """Delete what writers that died left in tmp/ (staging directories, refs half-written, corrupt objects half
        deleted); entries a live writer holds stay. Returns the names deleted."""
        gone = []
        for entry in self.fs.listdir(self._tmp):
            path = self._tmp / entry
            if not _TEMP.fullmatch(entry):
                continue
            # A corrupt object is only ever renamed here to be deleted: whoever moved it no longer needs it.
            if entry.startswith("corrupt-") and self.fs.kind(path) == "dir":
                self.fs.rmtree(path)
                gone.append(entry)
            elif discard_if_dead(path, self.fs):
                gone.append(entry)
        return gone

    async def get(self, ref: ArtifactRef) -> dict[str, bytes]:
        """A private copy of the artifact's files, verified against its digest."""
        return self._read_verified(ref)

    async def exists(self, ref: ArtifactRef) -> bool:
        """Whether an object with this digest is stored (cheap: does not re-hash; `get` does)."""
        return self.fs.kind(self._object_dir(_hex_of(ref))) == "dir"

    def resolve(self, name: str) -> ArtifactRef:
        """The ref last stored under `name` (for people and tools inspecting a store; loops pass refs, not names)."""
        path = self._refs / name
        if not _NAME.fullmatch(name) or self.fs.kind(path) != "file":
            raise ArtifactNotFoundError(f"no artifact was stored under the name {name!r} in {self.root}")
        try:
            digest = self.fs.read_bytes(path, limit=256).decode("ascii").strip()
        except (OverflowError, UnicodeDecodeError):
            digest = "<not a digest>"
        return self._ref_for(_hex_of(ArtifactRef(uri="", digest=digest)))

    async def put_dir(self, path: Path, name: str) -> ArtifactRef:
        """Store every file under the directory `path` (e.g. a PEFT adapter's `save_pretrained` output)."""
        return await put_dir(self, path, name)

    async def materialize(self, ref: ArtifactRef, dest_dir: Path) -> Path:
        """Write a verified copy of the artifact's files under `dest_dir` and return it (a real directory for PEFT)."""
        return await materialize(self, ref, dest_dir)


async def put_dir(artifacts: Artifacts, path: Path, name: str) -> ArtifactRef:
    """Store the directory `path` in any `Artifacts` store."""
    return await artifacts.put(read_dir(path), name=name)


async def materialize(artifacts: Artifacts, ref: ArtifactRef, dest_dir: Path) -> Path:
    """Write the artifact `ref` from any `Artifacts` store under `dest_dir`; returns `dest_dir`."""
    return write_files(await artifacts.get(ref), dest_dir)
