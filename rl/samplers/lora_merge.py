"""Switching the sampler's policy between LoRA adapters by rewriting one base copy's weights, not copying the base.

A plain LoRA adapter changes each targeted linear layer's weight to `W0 + scaling * B @ A` when merged. `MergedBase`
keeps one working copy of the base model and the original `W0` of every layer an adapter touched; activating an
adapter writes `W0 + (B @ A) * scaling` into those layers, the expression PEFT's `merge_and_unload` evaluates, so the
merged weights are the same bits whichever adapters were active before (`tests/test_lora_merge.py`). Activating costs
one small matmul per layer instead of a deep copy of the base plus PEFT's module injection.

Only plain LoRA is merged this way; `parse_lora` raises `UnsupportedLora` for anything else (DoRA, biases, rank
patterns, extra trained modules...) and the sampler then loads the adapter through PEFT.
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from safetensors.torch import load as load_safetensors
from torch import Tensor, nn

from rl.errors import UnsupportedLora

_PREFIX = "base_model.model."
# Config keys that make an adapter more than `W0 + scaling * B @ A` on linear layers when they are set.
_UNSUPPORTED = (
    "use_dora",
    "fan_in_fan_out",
    "modules_to_save",
    "rank_pattern",
    "alpha_pattern",
    "lora_bias",
    "layer_replication",
    "trainable_token_indices",
    "target_parameters",
    "alora_invocation_tokens",
    "use_bdlora",
)


@dataclass(frozen=True)
class LoraWeights:
    """A plain LoRA adapter: per targeted module path, its `(A [r, in], B [out, r])`, and the scaling."""

    scaling: float
    modules: Mapping[str, tuple[Tensor, Tensor]]


def parse_lora(config_json: bytes, weights: bytes) -> LoraWeights:
    """The adapter in PEFT's `adapter_config.json` and `adapter_model.safetensors` bytes; `UnsupportedLora` if it is
    not plain LoRA."""
    config = json.loads(config_json)
    if config.get("peft_type") != "LORA":
        raise UnsupportedLora(f"peft_type {config.get('peft_type')!r} is not LORA")
    used = [key for key in _UNSUPPORTED if config.get(key)]
    if used or config.get("bias", "none") != "none":
        raise UnsupportedLora(f"the adapter sets {used or ['bias']}")
    r, alpha = int(config["r"]), float(config["lora_alpha"])
    scaling = alpha / math.sqrt(r) if config.get("use_rslora") else alpha / r
    tensors = load_safetensors(weights)
    modules: dict[str, tuple[Tensor, Tensor]] = {}
    for name in tensors:
        if not (name.startswith(_PREFIX) and name.endswith((".lora_A.weight", ".lora_B.weight"))):
            raise UnsupportedLora(f"tensor {name} is not a LoRA A or B matrix")
        path = name[len(_PREFIX) : -len(".lora_A.weight")]
        if path not in modules:
            a, b = tensors.get(f"{_PREFIX}{path}.lora_A.weight"), tensors.get(f"{_PREFIX}{path}.lora_B.weight")
            if a is None or b is None:
                raise UnsupportedLora(f"module {path} lacks its lora_A or lora_B matrix")
            modules[path] = (a, b)
    return LoraWeights(scaling=scaling, modules=modules)


class MergedBase:
    """One working copy of `base` (eval mode, no grad) holding at most one merged adapter at a time."""

    def __init__(self, base: nn.Module) -> None:
        self.model = copy.deepcopy(base).eval()
        self.model.requires_grad_(False)
        self._original: dict[str, Tensor] = {}  # module path -> W0, for every layer any adapter touched
        self.active: str | None = None

    @torch.no_grad()
    def activate(self, key: str, lora: LoraWeights) -> nn.Module:
        """The model with `lora` merged (a no-op when `key` is already active). Raises `UnsupportedLora` if a module
        the adapter targets is not a linear layer of the matching shape (the weights are left as they were)."""
        if self.active == key:
            return self.model
        layers = {path: self._linear(path, a, b) for path, (a, b) in lora.modules.items()}
        self.active = None  # a failure below must not leave a half-merged model named as some adapter
        for path, original in self._original.items():
            if path not in layers:
                restored: Any = self.model.get_submodule(path)
                restored.weight.copy_(original)
        for path, layer in layers.items():
            a, b = lora.modules[path]
            original = self._original.setdefault(path, layer.weight.detach().clone())
            w = layer.weight
            w.copy_(original)
            w += (b.to(w.dtype) @ a.to(w.dtype)) * lora.scaling  # [out, in]: PEFT's merge, `W0 + (B @ A) * scaling`
        self.active = key
        return self.model

    def _linear(self, path: str, a: Tensor, b: Tensor) -> nn.Linear:
        try:
            layer = self.model.get_submodule(path)
        except AttributeError:
            raise UnsupportedLora(f"the base model has no module {path}") from None
        if not isinstance(layer, nn.Linear) or tuple(layer.weight.shape) != (b.shape[0], a.shape[1]):
            raise UnsupportedLora(f"module {path} is not a linear layer of shape {(b.shape[0], a.shape[1])}")
        return layer
