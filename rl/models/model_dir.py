"""The one check of a model directory, single-file or sharded, before anything loads it.

A Hugging Face model directory holds `config.json` and its weights either as one `model.safetensors` (what
`save_pretrained` writes below its shard size: the tiny models) or as shards `model-0000N-of-0000M.safetensors` listed
by `model.safetensors.index.json` (every real model: Qwen3-8B ships five). The check reads only the names in the
directory, `config.json` and the index, so it runs on a listing of a remote directory too (`rl.flyte.grpo`, at the
start of a run) and costs nothing beside loading the weights. What it refuses, it refuses in one line that names the
directory, what is wrong and what to do.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

from rl.errors import InputError

__all__ = [
    "CONFIG_FILE",
    "INDEX_FILE",
    "SINGLE_WEIGHTS_FILE",
    "TOKENIZER_FILES",
    "ModelDirError",
    "check_model_dir",
    "check_model_listing",
]

CONFIG_FILE = "config.json"
SINGLE_WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
TOKENIZER_FILES: tuple[str, ...] = ("tokenizer.json", "tokenizer_config.json")

_FIX = (
    "point at a complete Hugging Face model directory (config.json plus safetensors weights), e.g. one written by "
    "save_pretrained, `flyte prefetch hf-model` or rl.models.build_tiny_model"
)


class ModelDirError(InputError):
    """A model directory is missing, or lacks (or has damaged) the files a model is loaded from."""


def check_model_listing(
    where: str, names: Collection[str], read_text: Callable[[str], str], *, weights: bool, tokenizer: bool
) -> list[str]:
    """Check a model directory from its file `names` and a reader of its small JSON files; return its weight files.

    `weights`: `config.json` must parse, and the weights be `model.safetensors` or every shard the index names.
    `tokenizer`: the tokenizer files must be present. Raises `ModelDirError` (one line) otherwise.
    """
    present = set(names)
    required = ([CONFIG_FILE] if weights else []) + (list(TOKENIZER_FILES) if tokenizer else [])
    missing = [name for name in required if name not in present]
    if missing:
        raise ModelDirError(f"model directory {where} lacks {', '.join(missing)}; {_FIX}")
    if not weights:
        return []
    config = _json(where, CONFIG_FILE, read_text)
    if not isinstance(config, dict) or "model_type" not in config:
        raise ModelDirError(f"model directory {where}: {CONFIG_FILE} has no model_type; {_FIX}")
    if INDEX_FILE in present:
        index = _json(where, INDEX_FILE, read_text)
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict) or not weight_map:
            raise ModelDirError(f"model directory {where}: {INDEX_FILE} has no weight_map of tensors to shards; {_FIX}")
        shards = sorted({str(shard) for shard in weight_map.values()})
        bad = [s for s in shards if "/" in s or not s.endswith(".safetensors")]
        if bad:
            raise ModelDirError(
                f"model directory {where}: {INDEX_FILE} names shards that are not .safetensors files in the "
                f"directory ({', '.join(bad[:3])}); {_FIX}"
            )
        absent = [s for s in shards if s not in present]
        if absent:
            raise ModelDirError(
                f"model directory {where} lacks {len(absent)} of the {len(shards)} shards its {INDEX_FILE} names "
                f"({', '.join(absent[:3])}{', ...' if len(absent) > 3 else ''}); the download was incomplete: {_FIX}"
            )
        return shards
    if SINGLE_WEIGHTS_FILE in present:
        return [SINGLE_WEIGHTS_FILE]
    found = sorted(n for n in present if n.endswith((".bin", ".pt", ".pth", ".safetensors")))
    raise ModelDirError(
        f"model directory {where} has no {SINGLE_WEIGHTS_FILE} and no {INDEX_FILE}"
        f"{f' (it holds {found[:3]}: only safetensors weights are loaded)' if found else ''}; {_FIX}"
    )


def _json(where: str, name: str, read_text: Callable[[str], str]) -> Any:
    try:
        return json.loads(read_text(name))
    except (ValueError, UnicodeDecodeError) as exc:
        raise ModelDirError(f"model directory {where}: {name} is not valid JSON ({exc}); {_FIX}") from None


def check_model_dir(model_dir: Path, *, weights: bool = True, tokenizer: bool = False) -> Path:
    """`model_dir` if it holds what loading asks for (see `check_model_listing`); `ModelDirError` otherwise."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise ModelDirError(f"model directory {model_dir} does not exist or is not a directory; {_FIX}")
    names = [p.name for p in model_dir.iterdir() if p.is_file()]
    check_model_listing(
        str(model_dir), names, lambda name: (model_dir / name).read_text(), weights=weights, tokenizer=tokenizer
    )
    return model_dir
