"""AdamW's state as artifact files: the optimizer built over an adapter's parameters, and its state as bytes and back.

Format 2 (`optimizer.safetensors`) is written; format 1 (`optimizer.pt`, torch.save) is still read.
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors

from rl.errors import OptimizerStateError
from rl.trainer.config import TrainerConfig

__all__ = [
    "LEGACY_OPTIMIZER_FILE",
    "OPTIMIZER_FILE",
    "build_optimizer",
    "optimizer_files",
    "read_optimizer_state",
]

OPTIMIZER_FILE = "optimizer.safetensors"
LEGACY_OPTIMIZER_FILE = "optimizer.pt"  # format 1 (torch.save), written before format 2; still read
_OPTIMIZER_FORMAT = 2


def build_optimizer(
    params: Sequence[tuple[str, torch.nn.Parameter]], config: TrainerConfig, state: Mapping[str, bytes] | None
) -> torch.optim.AdamW:
    """AdamW over `params`, its moments and step count restored from an optimizer-state artifact's files if given."""
    optimizer = torch.optim.AdamW(
        [p for _, p in params],
        lr=config.lr,
        betas=config.betas,
        eps=config.adam_eps,
        weight_decay=config.weight_decay,
        foreach=False,  # one code path on every machine, so the bits do not depend on the kernel choice
    )
    if state is None:
        return optimizer
    saved = read_optimizer_state(state)
    names = [name for name, _ in params]
    if saved["param_names"] != names:
        raise OptimizerStateError(
            f"optimizer state covers {len(saved['param_names'])} parameters that differ from this adapter's "
            f"{len(names)}; the state and the adapter must come from the same TrainResult"
        )
    optimizer.load_state_dict(saved["state_dict"])
    return optimizer


def optimizer_files(optimizer: torch.optim.Optimizer, param_names: Sequence[str]) -> dict[str, bytes]:
    """The optimizer's state as artifact files: equal state gives equal bytes.

    Format 2 is one safetensors file: each state key's tensors (AdamW's `exp_avg`, `exp_avg_sq`, `step`) flattened and
    concatenated in parameter order into one tensor per key and dtype, with the layout, the parameter names and the
    param groups as JSON in its metadata. No pickle to load; a few tensors instead of three per parameter keeps the
    save well under a millisecond. Tensors are saved from the CPU, so the bytes name no device.
    """
    state_dict = optimizer.state_dict()
    parts: dict[str, list[torch.Tensor]] = {}
    layout: list[list[Any]] = []  # [param index, state key, tensor name, shape] in concatenation order
    for index, entry in sorted(state_dict["state"].items()):
        for key, value in sorted(entry.items()):
            if not isinstance(value, torch.Tensor):
                raise OptimizerStateError(f"optimizer state {index}.{key} is a {type(value).__name__}, not a tensor")
            name = f"{key}.{str(value.dtype).removeprefix('torch.')}"
            parts.setdefault(name, []).append(value.detach().reshape(-1).cpu())
            layout.append([index, key, name, list(value.shape)])
    tensors = {name: torch.cat(chunks) for name, chunks in parts.items()}
    # One metadata key: safetensors writes a metadata map's keys in no fixed order, and these bytes are a digest.
    about = {
        "format": _OPTIMIZER_FORMAT,
        "param_names": list(param_names),
        "param_groups": state_dict["param_groups"],
        "layout": layout,
    }
    metadata = {"optimizer": json.dumps(about, sort_keys=True, allow_nan=False)}
    return {OPTIMIZER_FILE: save_safetensors(tensors, metadata=metadata)}


def read_optimizer_state(files: Mapping[str, bytes]) -> dict[str, Any]:
    """`{"format", "param_names", "state_dict"}` from an optimizer-state artifact of format 2 or the older format 1.

    Raises:
        OptimizerStateError: no optimizer file, or one that is unreadable or of an unknown format.
    """
    if OPTIMIZER_FILE in files:
        try:
            tensors = load_safetensors(files[OPTIMIZER_FILE])
            about = json.loads(_safetensors_metadata(files[OPTIMIZER_FILE])["optimizer"])
            fmt, param_names, groups = about["format"], about["param_names"], about["param_groups"]
            state: dict[int, dict[str, torch.Tensor]] = {}
            offsets = dict.fromkeys(tensors, 0)
            for index, key, name, shape in about["layout"]:
                size = math.prod(shape)
                flat = tensors[name][offsets[name] : offsets[name] + size]
                offsets[name] += size
                state.setdefault(int(index), {})[key] = flat.reshape(shape).clone()
            if any(offsets[name] != tensors[name].numel() for name in tensors):
                raise ValueError("the layout does not cover its tensors exactly")
        except Exception as exc:
            raise OptimizerStateError(f"optimizer-state artifact's {OPTIMIZER_FILE} is unreadable: {exc}") from exc
        if fmt != _OPTIMIZER_FORMAT:
            raise OptimizerStateError(f"optimizer state has format {fmt}, this trainer reads formats 1 and 2")
        return {"format": fmt, "param_names": param_names, "state_dict": {"state": state, "param_groups": groups}}
    if LEGACY_OPTIMIZER_FILE in files:
        try:
            # Read onto the CPU; `load_state_dict` moves the moments to each parameter's device (CPU or CUDA).
            saved = torch.load(io.BytesIO(files[LEGACY_OPTIMIZER_FILE]), weights_only=True, map_location="cpu")
        except Exception as exc:
            raise OptimizerStateError(
                f"optimizer-state artifact's {LEGACY_OPTIMIZER_FILE} is unreadable: {exc}"
            ) from exc
        if not isinstance(saved, dict) or saved.get("format") != 1:
            fmt = saved.get("format") if isinstance(saved, dict) else None
            raise OptimizerStateError(f"optimizer state has format {fmt!r}, this trainer reads formats 1 and 2")
        return saved
    raise OptimizerStateError(
        f"optimizer-state artifact lacks {OPTIMIZER_FILE} (has {sorted(files)}); pass the optimizer_state of the "
        "TrainResult that produced this batch's adapter"
    )


def _safetensors_metadata(blob: bytes) -> dict[str, str]:
    """The `__metadata__` of a safetensors blob (safetensors' Python API reads metadata only from files)."""
    header_len = int.from_bytes(blob[:8], "little")
    header = json.loads(blob[8 : 8 + header_len])
    metadata = header.get("__metadata__") or {}
    if not isinstance(metadata, dict):
        raise ValueError("the safetensors header's __metadata__ is not an object")
    return {str(k): str(v) for k, v in metadata.items()}
