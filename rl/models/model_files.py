"""The one opener of a model directory's files, and the private copy that transformers loads from.

Every file a load reads (config, generation config, tokenizer files, chat template, index, weights) is opened here:
a regular file directly in the directory (no symlink, no FIFO or device), with one hard link, no larger than its kind
allows; a weights file's safetensors header is parsed and checked against the file's size. The checked bytes of the
small files, and the weights' open descriptors, are then handed to transformers through a private staging directory
(`stage_files`, which `rl.models.opened_model.ModelDir.staged` calls for every loader): it holds only the files named
in `FILE_LIMITS` and the weights the listing names, so anything else in the directory (a `.py`,
`additional_chat_templates/`, a pickle) is never read, and a swap between the check and the load changes nothing that
is loaded. `rl.models.model_checks` compares what was read before anything is allocated. docs/guarantees.md says what
a model directory may and may not do.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rl.errors import ModelFileError, RunDirError, UnsafeRunDirError, UntrustedValueError
from rl.models.model_dir import CONFIG_FILE, INDEX_FILE, MODEL_DIR_FIX, check_model_dir
from rl.storage.safe_fs import Tree, special_kind
from rl.untrusted import parse_json, shown

__all__ = ["FILE_LIMITS", "CheckedModelDir", "WeightsFile", "open_model_dir", "stage_files"]

MIB = 1 << 20
# What transformers' config, generation-config, tokenizer and model loaders read for llama, qwen2 and qwen3, with the
# most bytes each may hold (a real one is far below: Qwen3's tokenizer.json is 11 MB, a chat template a few KB).
FILE_LIMITS: dict[str, int] = {
    CONFIG_FILE: MIB,
    "generation_config.json": MIB,
    "tokenizer.json": 16 * MIB,
    "tokenizer_config.json": 16 * MIB,
    "special_tokens_map.json": MIB,
    "added_tokens.json": 16 * MIB,
    "chat_template.jinja": MIB,
    "chat_template.json": MIB,
    "vocab.json": 16 * MIB,
    "merges.txt": 16 * MIB,
    INDEX_FILE: 16 * MIB,
}
HEADER_LIMIT = 16 * MIB  # a safetensors header (Qwen3-8B's is ~40 KB a shard)
# Bytes per element of each safetensors dtype.
DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}
DTYPE_BYTES |= {"F8_E4M3": 1, "F8_E5M2": 1, "U16": 2, "U32": 4, "U64": 8}
# A tensor name as the architectures name theirs: never escape sequences or spaces (they reach logs and terminals).
TENSOR_NAME = re.compile(r"[A-Za-z0-9_]+(\.[A-Za-z0-9_]+)*")


@dataclass
class WeightsFile:
    """A checked safetensors file: its open descriptor and its header's tensors, name -> (dtype, shape)."""

    name: str
    fd: int
    size: int
    tensors: dict[str, tuple[str, tuple[int, ...]]]


@dataclass
class CheckedModelDir:
    """What the checked opener read from `where`: small files' bytes, and the weights (open until `close`)."""

    where: Path
    files: dict[str, bytes] = field(default_factory=dict)
    weights: dict[str, WeightsFile] = field(default_factory=dict)

    def json(self, name: str) -> Any:
        """The parsed JSON file `name` (None when absent), refused in one line when it is not strict JSON."""
        if name not in self.files:
            return None
        try:
            return parse_json(self.files[name])
        except UntrustedValueError as exc:
            part = "tokenizer" if "token" in name or "template" in name else "config"
            raise ModelFileError(
                f"model directory {shown(self.where)}: its {part} cannot be read ({name} is not valid JSON: {exc}); "
                f"{MODEL_DIR_FIX}"
            ) from None

    def close(self) -> None:
        for weights in self.weights.values():
            with contextlib.suppress(OSError):
                os.close(weights.fd)
        self.weights.clear()


def _refuse(where: Path, name: str, what: str) -> ModelFileError:
    return ModelFileError(
        f"model directory {shown(where)}: {shown(name)} is {what}; a model directory's files must be regular files "
        f"in it, read nowhere else. {MODEL_DIR_FIX}"
    )


def _damaged(where: Path, name: str, what: str) -> ModelFileError:
    return ModelFileError(
        f"model directory {shown(where)}: its weights cannot be read ({name} is {what}); {MODEL_DIR_FIX}"
    )


def _open(fs: Tree, where: Path, name: str, limit: int | None) -> int:
    """A read-only descriptor of the regular file `name` in `where`: a link (symlink or hard), FIFO, device or a file
    over `limit` bytes (sparse or not: by its size, before a byte is read) refused by name."""
    kind = fs.kind(where / name)
    if kind != "file":
        kind = special_kind(fs.lstat(where / name).st_mode) if kind == "other" else kind
        raise _refuse(where, name, f"a {kind}, not a regular file")
    try:
        fd = fs.open_regular(where / name)
    except UnsafeRunDirError:  # swapped for a link or FIFO since the listing
        raise _refuse(where, name, "no longer a regular file (changed while it was checked)") from None
    try:
        st = os.fstat(fd)
        if st.st_nlink != 1:
            raise _refuse(where, name, f"a file with {st.st_nlink} hard links (one may be outside the directory)")
        if limit is not None and st.st_size > limit:
            raise _refuse(where, name, f"{st.st_size} bytes, more than the {limit} such a file may hold")
    except BaseException:
        os.close(fd)
        raise
    return fd


def _read(fs: Tree, where: Path, name: str, limit: int) -> bytes:
    with open(_open(fs, where, name, limit), "rb") as f:
        data = f.read(limit + 1)  # +1: a file that grew since the fstat
    if len(data) > limit:
        raise _refuse(where, name, f"more than the {limit} bytes such a file may hold")
    return data


def _header(where: Path, name: str, fd: int) -> WeightsFile:
    """The checked header of the safetensors file open at `fd`: a JSON object of tensors, each a known dtype and a
    shape whose bytes are its span, the spans ending at the file's end."""
    size = os.fstat(fd).st_size
    head = os.pread(fd, 8, 0)
    length = int.from_bytes(head, "little") if len(head) == 8 else -1
    if not 2 <= length <= min(size - 8, HEADER_LIMIT):
        raise _damaged(where, name, f"not a safetensors file (its header claims {length} bytes of {size})")
    try:
        header = parse_json(os.pread(fd, length, 8))
    except UntrustedValueError as exc:
        raise _damaged(where, name, f"a safetensors file whose header is not JSON ({exc})") from None
    if not isinstance(header, dict):
        raise _damaged(where, name, "a safetensors file whose header is not a JSON object")
    tensors: dict[str, tuple[str, tuple[int, ...]]] = {}
    end = 0
    for key, value in header.items():
        if key == "__metadata__":
            continue
        if not TENSOR_NAME.fullmatch(key) or len(key) > 300:
            raise _damaged(where, name, f"a safetensors file naming a tensor {shown(repr(key), 60)}, not a module name")
        entry: dict[str, Any] = value if isinstance(value, dict) else {}
        dtype, shape, span = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
        if not (
            isinstance(dtype, str)
            and dtype in DTYPE_BYTES
            and isinstance(shape, list)
            and all(type(d) is int and 0 <= d < 1 << 40 for d in shape)
            and isinstance(span, list)
            and len(span) == 2
            and all(type(o) is int for o in span)
        ):
            raise _damaged(where, name, f"a safetensors file whose tensor {key} has a bad dtype, shape or span")
        numel = 1
        for dim in shape:
            numel *= dim
        if not 0 <= span[0] <= span[1] or span[1] - span[0] != numel * DTYPE_BYTES[dtype]:
            raise _damaged(where, name, f"a safetensors file whose tensor {key} has a bad dtype, shape or span")
        tensors[key] = (dtype, tuple(shape))
        end = max(end, span[1])
    if 8 + length + end != size:
        raise _damaged(where, name, f"a safetensors file of {size} bytes whose header describes {8 + length + end}")
    return WeightsFile(name, fd, size, tensors)


def open_model_dir(
    model_dir: Path,
    *,
    weights: bool = True,
    tokenizer: bool | None = None,
    expect: Mapping[str, object] | None = None,
) -> CheckedModelDir:
    """Read `model_dir` through the checked opener: `check_model_dir`'s listing checks (the tokenizer's files required
    with `tokenizer`, by default when not `weights`; config.json equal to `expect` where given), then every file of
    `FILE_LIMITS` present and (with `weights`) every weights file's header. The caller closes the result."""
    tokenizer = not weights if tokenizer is None else tokenizer
    model_dir = check_model_dir(Path(model_dir), weights=weights, tokenizer=tokenizer, expect=expect)
    fs = Tree(model_dir)
    present = set(fs.listdir(model_dir))
    checked = CheckedModelDir(model_dir)
    try:
        for name, limit in FILE_LIMITS.items():
            if name in present:
                checked.files[name] = _read(fs, model_dir, name, limit)
        if weights:
            index = checked.json(INDEX_FILE)
            names = sorted({str(s) for s in index["weight_map"].values()}) if index else ["model.safetensors"]
            for name in names:  # check_model_dir: each a plain .safetensors name present in the directory
                fd = _open(fs, model_dir, name, None)
                checked.weights[name] = WeightsFile(name, fd, 0, {})
                checked.weights[name] = _header(model_dir, name, fd)
    except BaseException:
        checked.close()
        raise
    return checked


def _hand_over(fd: int, target: Path) -> None:
    """Make `target` read the file open at `fd`: a link to the descriptor itself (Linux: no copy, and no later
    rename in the model directory can change which file it is; by pid, so this process's children, vLLM's engine
    among them, read it too), else a copy of its bytes."""
    proc = f"/proc/{os.getpid()}/fd/{fd}"
    if os.path.exists(proc):
        os.symlink(proc, target)
        return
    with open(target, "xb") as dst:  # no /proc (macOS)
        offset = 0
        while chunk := os.pread(fd, MIB, offset):  # by offset: loads staging the one held descriptor at once agree
            dst.write(chunk)
            offset += len(chunk)


@contextlib.contextmanager
def stage_files(checked: CheckedModelDir) -> Iterator[Path]:
    """A private directory holding the bytes of `checked`'s small files and links to its open weights (nothing read
    from its directory again); removed after the block."""
    with _new_stage() as stage:
        for name, data in checked.files.items():
            fd = os.open(stage / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
            with open(fd, "wb") as f:
                f.write(data)
        for name, weights_file in checked.weights.items():
            _hand_over(weights_file.fd, stage / name)
        yield stage


STAGE_PREFIX = "rl-model-"


@contextlib.contextmanager
def _new_stage() -> Iterator[Path]:
    """A private (0700) directory in the temp directory, locked while the block runs and removed after; those a
    killed process left (no live lock: `rl.storage.dead_writers`) go first."""
    from rl.storage.dead_writers import discard_if_dead, locked_new_dir_at

    root = Path(tempfile.gettempdir())
    fs = Tree(root)
    for name in os.listdir(root):
        if name.startswith(STAGE_PREFIX):
            with contextlib.suppress(OSError, RunDirError):  # another user's, or gone meanwhile
                discard_if_dead(root / name, fs)
    with fs.directory(root) as root_fd, locked_new_dir_at(root_fd, lambda: STAGE_PREFIX + secrets.token_hex(6)) as held:
        stage = root / held[0]
        try:
            os.fchmod(held[1], 0o700)
            yield stage
        finally:
            shutil.rmtree(stage, ignore_errors=True)
