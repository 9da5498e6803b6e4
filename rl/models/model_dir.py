"""The one check of a model directory, single-file or sharded, before anything loads it.

A Hugging Face model directory holds `config.json` and its weights either as one `model.safetensors` (what
`save_pretrained` writes below its shard size: the tiny models) or as shards `model-0000N-of-0000M.safetensors` listed
by `model.safetensors.index.json` (every real model: Qwen3-8B ships five). The check reads only the names in the
directory, `config.json` and the index, so it runs on a listing of a remote directory too (`rl.deploy.flyte.grpo`, at
the start of a run) and costs nothing beside loading the weights. What it refuses, it refuses in one line that names the
directory, what is wrong and what to do.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any

from rl.errors import AdapterDirError, ModelDirError, UntrustedValueError, shown
from rl.storage.safe_fs import Tree
from rl.untrusted import parse_json

__all__ = [
    "CONFIG_FILE",
    "INDEX_FILE",
    "KNOWN_MODEL_TYPES",
    "SINGLE_WEIGHTS_FILE",
    "TOKENIZER_CONFIG",
    "TOKENIZER_FILES",
    "check_adapter_config",
    "check_adapter_dir",
    "check_adapter_files",
    "check_model_config",
    "check_model_dir",
    "check_model_listing",
    "check_safetensors_header",
]

CONFIG_FILE = "config.json"
SINGLE_WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
TOKENIZER_FILES: tuple[str, ...] = ("tokenizer.json", TOKENIZER_CONFIG)
MAX_JSON_BYTES = 16 << 20  # config.json is a few KB, a tokenizer.json a few MB, an 8B model's index ~30 KB

KNOWN_MODEL_TYPES = frozenset({"qwen2", "qwen3", "llama"})
"""The architectures transformers builds from its own code for this tool: the tiny model (qwen2), the real family
(qwen3) and the small pretrained models (llama: SmolLM2)."""
# The sizes a config may give, with room above the largest model of these families (Llama 3 405B, Qwen3's 151,936
# tokens, 128k positions): past them, a config is not a model this tool loads, and would size memory by a number.
SIZE_BOUNDS: dict[str, int] = {
    "vocab_size": 1 << 20,
    "hidden_size": 1 << 15,
    "intermediate_size": 1 << 18,
    "num_hidden_layers": 1 << 10,
    "num_attention_heads": 1 << 10,
    "num_key_value_heads": 1 << 10,
    "head_dim": 1 << 12,
    "max_position_embeddings": 1 << 21,
}
REQUIRED_SIZES = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads")
# Keys with which transformers (or vLLM) would import Python from the directory: never honoured, so refused.
CODE_KEYS = ("auto_map", "custom_pipelines")

MODEL_DIR_FIX = (
    "point at a complete Hugging Face model directory (config.json plus safetensors weights), e.g. one written by "
    "save_pretrained, `flyte prefetch hf-model` or rl.models.build_tiny_model"
)


def check_model_listing(
    where: str,
    names: Collection[str],
    read_text: Callable[[str], str],
    *,
    weights: bool,
    tokenizer: bool,
    expect: Mapping[str, object] | None = None,
) -> list[str]:
    """Check a model directory from its file `names` and a reader of its small JSON files; return its weight files.

    `weights`: `config.json` must parse, and the weights be `model.safetensors` or every shard the index names.
    `tokenizer`: the tokenizer files must be present. `config.json` passes `check_model_config` (with `expect`).
    Raises `ModelDirError` (one line) otherwise.
    """
    present = set(names)
    required = ([CONFIG_FILE] if weights else []) + (list(TOKENIZER_FILES) if tokenizer else [])
    missing = [name for name in required if name not in present]
    if missing:
        raise ModelDirError(f"model directory {where} lacks {', '.join(missing)}; {MODEL_DIR_FIX}")
    if tokenizer:
        tok = _json(where, TOKENIZER_CONFIG, read_text)
        if isinstance(tok, dict) and any(key in tok for key in CODE_KEYS):
            raise ModelDirError(
                f"model directory {where}: tokenizer_config.json names code to run ({', '.join(CODE_KEYS)}); this "
                f"tool never runs code from a model directory. {MODEL_DIR_FIX}"
            )
    if not weights:
        return []
    check_model_config(_json(where, CONFIG_FILE, read_text), where, expect=expect)
    if INDEX_FILE in present:
        index = _json(where, INDEX_FILE, read_text)
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict) or not weight_map:
            raise ModelDirError(
                f"model directory {where}: {INDEX_FILE} has no weight_map of tensors to shards; {MODEL_DIR_FIX}"
            )
        shards = sorted({str(shard) for shard in weight_map.values()})
        bad = [s for s in shards if "/" in s or not s.endswith(".safetensors")]
        if bad:
            raise ModelDirError(
                f"model directory {where}: {INDEX_FILE} names shards that are not .safetensors files in the "
                f"directory ({', '.join(bad[:3])}); {MODEL_DIR_FIX}"
            )
        absent = [s for s in shards if s not in present]
        if absent:
            raise ModelDirError(
                f"model directory {where} lacks {len(absent)} of the {len(shards)} shards its {INDEX_FILE} names "
                f"({', '.join(absent[:3])}{', ...' if len(absent) > 3 else ''}); the download was incomplete: "
                f"{MODEL_DIR_FIX}"
            )
        return shards
    if SINGLE_WEIGHTS_FILE in present:
        return [SINGLE_WEIGHTS_FILE]
    found = sorted(n for n in present if n.endswith((".bin", ".pt", ".pth", ".safetensors")))
    raise ModelDirError(
        f"model directory {where} has no {SINGLE_WEIGHTS_FILE} and no {INDEX_FILE}"
        f"{f' (it holds {found[:3]}: only safetensors weights are loaded)' if found else ''}; {MODEL_DIR_FIX}"
    )


def check_model_config(config: object, where: str, *, expect: Mapping[str, object] | None = None) -> dict[str, Any]:
    """`config` (a model's parsed config.json) if it is one this tool loads: a `model_type` of `KNOWN_MODEL_TYPES`,
    no key that names code to run (`CODE_KEYS`), each size an integer within `SIZE_BOUNDS`, and every key of `expect`
    (what this tool wrote, for a model it built) equal. `ModelDirError` (one line naming `where`) otherwise.

    Called before anything loads a model directory, so transformers is never asked to import (or prompt about) code
    a directory someone sent holds; a real Hugging Face llama, qwen2 or qwen3 directory passes."""
    if not isinstance(config, dict):
        raise ModelDirError(f"model directory {shown(where)}: {CONFIG_FILE} is not a JSON object; {MODEL_DIR_FIX}")
    model_type = config.get("model_type")
    if model_type not in KNOWN_MODEL_TYPES:
        raise ModelDirError(
            f"model directory {shown(where)}: {CONFIG_FILE} has model_type {shown(repr(model_type), 60)}, not one of "
            f"{', '.join(sorted(KNOWN_MODEL_TYPES))} (the architectures this tool loads without running the "
            f"directory's code); {MODEL_DIR_FIX}"
        )
    code = [key for key in CODE_KEYS if key in config]
    if code:
        raise ModelDirError(
            f"model directory {shown(where)}: {CONFIG_FILE} names code to run ({', '.join(code)}); this tool never "
            f"runs code from a model directory. {MODEL_DIR_FIX}"
        )
    for key, bound in SIZE_BOUNDS.items():
        value = config.get(key)
        if value is None and key not in REQUIRED_SIZES:
            continue
        if type(value) is not int or not 1 <= value <= bound:
            raise ModelDirError(
                f"model directory {shown(where)}: {CONFIG_FILE}'s {key} is {shown(repr(value), 60)}, not an integer "
                f"from 1 to {bound}; {MODEL_DIR_FIX}"
            )
    wrong = [key for key, value in (expect or {}).items() if config.get(key) != value]
    if wrong:
        raise ModelDirError(
            f"model directory {shown(where)}: {CONFIG_FILE} differs from the model this tool built there "
            f"({', '.join(wrong)}); delete it to have it rebuilt"
        )
    return config


ADAPTER_WEIGHTS_FILE = "adapter_model.safetensors"
MAX_LORA_RANK = 1024
MAX_SAFETENSORS_HEADER = 100 << 20  # safetensors' own limit on a header's length
# A module name as PEFT matches it when target_modules is a list (the name, or a suffix after a dot), never a regex.
_MODULE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)*")
# Keys PEFT reads as regular expressions, module lists beside the targets, or code to import: what this tool writes
# there is empty, and anything else would match by regex (a pathological one hangs), save or import more.
_EMPTY_ADAPTER_KEYS = (
    "alpha_pattern",
    "rank_pattern",
    "layers_pattern",
    "layers_to_transform",
    "exclude_modules",
    "modules_to_save",
    "target_parameters",
    "trainable_token_indices",
    "layer_replication",
    "megatron_config",  # PEFT imports megatron_core (another key) when this is set
)
# auto_mapping (a class and module name) is read only by AutoPeftModel, which nothing here calls: PEFT writes it.


def check_adapter_config(config: object, where: str) -> dict[str, Any]:
    """`config` (a parsed adapter_config.json) if it is a LoRA config as this tool writes it: peft_type LORA,
    `target_modules` a list of plain module names (never a string, which PEFT matches as a regex), a rank from 1 to
    `MAX_LORA_RANK`, a finite positive alpha, and every pattern, extra-module or code key empty. `AdapterDirError`
    (one line naming `where`) otherwise."""

    def refuse(what: str) -> AdapterDirError:
        return AdapterDirError(
            f"adapter {shown(where)}: adapter_config.json {what}; this tool loads only the LoRA adapters its trainer "
            "writes. Put the adapter again, or rerun the step that made it"
        )

    if not isinstance(config, dict):
        raise refuse("is not a JSON object")
    if config.get("peft_type") != "LORA":
        raise refuse(f"has peft_type {shown(repr(config.get('peft_type')), 40)}, not 'LORA'")
    targets = config.get("target_modules")
    if not isinstance(targets, list) or not 1 <= len(targets) <= 1 << 14:
        raise refuse(f"has target_modules {shown(repr(targets), 60)}, not a list of module names")
    bad = [t for t in targets if not isinstance(t, str) or len(t) > 200 or not _MODULE_NAME.fullmatch(t)]
    if bad:
        raise refuse(f"names a target module {shown(repr(bad[0]), 60)} that is not a plain dotted module name")
    rank = config.get("r")
    if type(rank) is not int or not 1 <= rank <= MAX_LORA_RANK:
        raise refuse(f"has r {shown(repr(rank), 40)}, not an integer from 1 to {MAX_LORA_RANK}")
    alpha = config.get("lora_alpha")
    if not isinstance(alpha, int | float) or isinstance(alpha, bool) or not (math.isfinite(alpha) and 0 < alpha <= 1e6):
        raise refuse(f"has lora_alpha {shown(repr(alpha), 40)}, not a finite number from 0 to 1e6")
    set_keys = [key for key in _EMPTY_ADAPTER_KEYS if config.get(key) not in (None, {}, [])]
    if set_keys:
        raise refuse(f"sets {', '.join(set_keys)}, which this tool never writes")
    return config


def check_safetensors_header(head: bytes, size: int, where: str) -> None:
    """Refuse (`AdapterDirError`) a safetensors file of `size` bytes, starting with `head` (at least 8 bytes), whose
    header is not a JSON object that fits in the file: a header claiming 2**40 bytes is refused by name before a
    loader reads it."""
    length = int.from_bytes(head[:8], "little") if len(head) >= 8 else -1
    if not 2 <= length <= min(size - 8, MAX_SAFETENSORS_HEADER) or head[8:9] not in (b"{", b""):
        raise AdapterDirError(
            f"{shown(where)} is not a safetensors file this tool wrote (its header claims {length} bytes of "
            f"{size}); put the adapter again, or rerun the step that made it"
        )


ADAPTER_CONFIG_FILE = "adapter_config.json"


def check_adapter_files(where: str, files: Mapping[str, bytes]) -> None:
    """Refuse (`AdapterDirError`) an adapter's files unless they are adapter_config.json (`check_adapter_config`) and
    adapter_model.safetensors (`check_safetensors_header`): an `adapter_model.bin` is a pickle, never loaded."""
    _check_adapter(
        where,
        set(files),
        lambda: files[ADAPTER_CONFIG_FILE],
        files.get(ADAPTER_WEIGHTS_FILE, b"")[:16],
        len(files.get(ADAPTER_WEIGHTS_FILE, b"")),
    )


def check_adapter_dir(adapter_dir: Path) -> None:
    """`check_adapter_files` of the directory `adapter_dir`, read without following a link, blocking on a FIFO or
    reading more than a config's and a header's bytes."""
    fs = Tree(adapter_dir)
    kinds = {name: fs.kind(adapter_dir / name) for name in fs.listdir(adapter_dir)} if adapter_dir.is_dir() else {}
    names = {name for name, kind in kinds.items() if kind == "file"}
    head, size = b"", 0
    if ADAPTER_WEIGHTS_FILE in names:
        with open(fs.open_regular(adapter_dir / ADAPTER_WEIGHTS_FILE), "rb") as f:
            head, size = f.read(16), os.fstat(f.fileno()).st_size

    def config() -> bytes:
        try:
            return fs.read_bytes(adapter_dir / ADAPTER_CONFIG_FILE, limit=1 << 20)
        except OverflowError:
            return b"<larger than 1 MiB>"

    _check_adapter(str(adapter_dir), names, config, head, size)


def _check_adapter(where: str, names: set[str], config: Callable[[], bytes], head: bytes, size: int) -> None:
    pickles = sorted(n for n in names if n.endswith((".bin", ".pt", ".pth", ".pkl")))
    if pickles:
        raise AdapterDirError(
            f"adapter {shown(where)} holds {shown(', '.join(pickles))}, a pickle: this tool loads adapters only from "
            f"{ADAPTER_WEIGHTS_FILE}. Put the adapter again, or rerun the step that made it"
        )
    missing = [n for n in (ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE) if n not in names]
    if missing:
        raise AdapterDirError(
            f"adapter {shown(where)} lacks {', '.join(missing)} (it holds {shown(sorted(names) or 'nothing')}); pass "
            "an adapter a trainer's init_adapter or train_step returned"
        )
    try:
        parsed = parse_json(config())
    except UntrustedValueError as exc:
        raise AdapterDirError(
            f"adapter {shown(where)}: {ADAPTER_CONFIG_FILE} is not JSON this tool wrote ({exc})"
        ) from None
    check_adapter_config(parsed, where)
    check_safetensors_header(head, size, f"{where}/{ADAPTER_WEIGHTS_FILE}")


def _size(fs: Tree, path: Path) -> int:
    return fs.lstat(path).st_size


def _json(where: str, name: str, read_text: Callable[[str], str]) -> Any:
    try:
        return parse_json(read_text(name))
    except (UntrustedValueError, UnicodeDecodeError, OverflowError) as exc:
        raise ModelDirError(
            f"model directory {shown(where)}: {name} is not valid JSON ({exc}); {MODEL_DIR_FIX}"
        ) from None


def check_model_dir(
    model_dir: Path, *, weights: bool = True, tokenizer: bool = False, expect: Mapping[str, object] | None = None
) -> Path:
    """`model_dir` if it holds what loading asks for (see `check_model_listing`); `ModelDirError` otherwise."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise ModelDirError(f"model directory {model_dir} does not exist or is not a directory; {MODEL_DIR_FIX}")
    fs = Tree(model_dir)  # a FIFO, device or link at a file's name is refused, never opened or followed
    names = [name for name in fs.listdir(model_dir) if fs.kind(model_dir / name) == "file"]
    # The JSON files a loader reads whole (the tokenizer's included): refused by size before anything reads them.
    small = (CONFIG_FILE, INDEX_FILE, *TOKENIZER_FILES)
    large = [n for n in small if n in names and _size(fs, model_dir / n) > MAX_JSON_BYTES]
    if large:
        raise ModelDirError(
            f"model directory {shown(model_dir)}: {', '.join(large)} holds more than {MAX_JSON_BYTES} bytes, more than "
            f"a model's JSON files do; {MODEL_DIR_FIX}"
        )
    check_model_listing(
        str(model_dir),
        names,
        lambda name: fs.read_bytes(model_dir / name, limit=MAX_JSON_BYTES).decode(),
        weights=weights,
        tokenizer=tokenizer,
        expect=expect,
    )
    return model_dir
