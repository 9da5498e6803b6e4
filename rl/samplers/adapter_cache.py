"""PEFT LoRA adapters loaded from directories over copies of one base model, cached by artifact digest."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import copy
import warnings
from collections import OrderedDict
from pathlib import Path

import torch
from torch import nn

from rl.errors import AdapterDirError, NotAnAdapterError, shown
from rl.models import load_base_model
from rl.models.model_dir import check_adapter_dir
from rl.models.opened_model import ModelDir, checked_model
from rl.models.tiny import LOADER_ERRORS

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")


class AdapterCache:
    """Base model + LoRA adapters loaded from directories, cached by key (an artifact digest), least recently used out.

    Each cached adapter wraps its own copy of the base model. That costs `capacity` x the base model's memory, which is
    nothing for the tiny CPU model, and keeps every policy a plain, independent `PeftModel` (PEFT's multi-adapter
    switching would share the base but make an adapter's forward depend on which others were loaded or deleted).
    Large models belong on vLLM (rl.samplers.vllm), which shares one base across LoRA adapters on the GPU.

    `merge=True` folds each adapter into its base copy once (W + s·BA, PEFT's `merge_and_unload`): decoding then runs
    the plain model, faster, because an unmerged LoRA adds two small matmuls and Python overhead to every linear
    layer at every step. Log-probs then differ from the unmerged PEFT forward the trainer uses by float rounding only
    (the tests bound it by 1e-5; docs/benchmarks.md has the figures), as vLLM's LoRA kernels also differ;
    results stay bitwise reproducible. `merge=False` keeps the exact PEFT forward.
    """

    def __init__(
        self, base_model_dir: ModelDir, *, capacity: int = 2, dtype: torch.dtype = torch.float32, merge: bool = False
    ) -> None:
        if capacity < 1:
            raise ValueError(f"adapter cache capacity must be >= 1, got {capacity}")
        self.base_model_dir = checked_model(base_model_dir, weights=True)  # opened at the command's door
        self.capacity = capacity
        self.merge = merge
        self.base = load_base_model(self.base_model_dir, dtype=dtype)
        self._models: OrderedDict[str, nn.Module] = OrderedDict()
        self.loads = 0  # adapters loaded from disk, for tests and the benchmark

    def get(self, key: str) -> nn.Module | None:
        model = self._models.get(key)
        if model is not None:
            self._models.move_to_end(key)
        return model

    def clear(self) -> None:
        """Drop every cached adapter model (the base stays loaded)."""
        self._models.clear()

    def load_dir(self, key: str, adapter_dir: Path) -> nn.Module:
        """Load the PEFT LoRA adapter in `adapter_dir` over a fresh copy of the base model (frozen, eval mode)."""
        from peft import PeftModel

        adapter_dir = Path(adapter_dir)
        present = {p.name for p in adapter_dir.iterdir()} if adapter_dir.is_dir() else set()
        if ADAPTER_CONFIG not in present or not present & set(ADAPTER_WEIGHTS):
            raise NotAnAdapterError(
                f"{adapter_dir} is not a PEFT LoRA adapter directory (it holds {sorted(present) or 'nothing'}; "
                f"expected {ADAPTER_CONFIG} and one of {', '.join(ADAPTER_WEIGHTS)}); pass the adapter a trainer's "
                "init_adapter/train_step returned"
            )
        check_adapter_dir(adapter_dir)  # a pickle, a regex target, a damaged header: refused before PEFT reads it
        with warnings.catch_warnings():
            # peft 0.21 probes a property transformers 5.2x deprecated; the warning is theirs and says nothing to users.
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
            try:
                model = PeftModel.from_pretrained(
                    copy.deepcopy(self.base), str(adapter_dir), is_trainable=False, trust_remote_code=False
                )
            except LOADER_ERRORS as exc:
                raise AdapterDirError(
                    f"adapter {shown(adapter_dir)} cannot be loaded ({shown(exc, 300)}); put the adapter again, or "
                    "rerun the step that made it"
                ) from exc
        if self.merge:
            model = model.merge_and_unload()
        model.eval()
        self.loads += 1
        self._models[key] = model
        self._models.move_to_end(key)
        while len(self._models) > self.capacity:
            self._models.popitem(last=False)
        return model
