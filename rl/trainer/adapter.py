"""A LoRA adapter as artifact files: a fresh one, one loaded onto the base model, and the bytes a model's adapter is.

The bytes are canonical (PEFT lists `target_modules` in set order, which changes with the interpreter's hash seed), so
equal weights and equal LoRA config give equal bytes and an adapter is identified by its content digest.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import contextlib
import json
import tempfile
import warnings
import weakref
from collections.abc import Iterator, Mapping
from pathlib import Path

import torch
from peft import LoraConfig, PeftModel, get_peft_model, get_peft_model_state_dict
from safetensors.torch import save as save_safetensors

from rl.errors import AdapterArtifactError, AdapterDirError, shown
from rl.models import load_base_model
from rl.models.model_dir import check_adapter_files
from rl.models.opened_model import ModelDir
from rl.models.tiny import LOADER_ERRORS
from rl.trainer.config import TrainerConfig, torch_dtype

__all__ = [
    "ADAPTER_FILES",
    "adapter_files",
    "load_policy",
    "new_adapter",
    "trainable_parameters",
]

ADAPTER_FILES: tuple[str, ...] = ("adapter_config.json", "adapter_model.safetensors")


@contextlib.contextmanager
def _quiet_peft() -> Iterator[None]:
    with warnings.catch_warnings():
        # peft 0.21 probes a property transformers 5.2x deprecated; the warning is theirs and says nothing to users.
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        yield


def new_adapter(base_dir: ModelDir, config: TrainerConfig, seed: int) -> PeftModel:
    """A fresh LoRA adapter on the opened base model `base_dir`, its initial weights a function of `seed` alone.

    The base is held as `config` says (`base_model`); the adapter's weights are float32 whatever the base's dtype
    (PEFT's `autocast_adapter_dtype`), so version 0's bytes do not depend on how the base is held.
    """
    base = base_model(base_dir, config)
    target = config.target_modules if isinstance(config.target_modules, str) else list(config.target_modules)
    lora = LoraConfig(
        r=config.lora_rank,
        lora_alpha=config.lora_alpha,
        lora_dropout=config.lora_dropout,
        target_modules=target,
        bias="none",
        task_type="CAUSAL_LM",
    )
    # Forked so seeding the adapter's init neither depends on nor disturbs the caller's RNG stream.
    with torch.random.fork_rng(devices=[]), _quiet_peft():
        torch.manual_seed(seed)
        model = get_peft_model(base, lora)
    return model


def base_model(base_dir: ModelDir, config: TrainerConfig, device: str | torch.device = "cpu") -> torch.nn.Module:
    """The frozen base model as `config` holds it: its dtype, attention kernel and gradient checkpointing.

    Checkpointing is torch's non-reentrant kind: the reentrant one needs an input that requires grad, which a frozen
    base's embeddings never give, and would silently train nothing below the first checkpointed layer.
    """
    base = load_base_model(base_dir, dtype=torch_dtype(config.base_dtype), device=device, attention=config.attention)
    if config.gradient_checkpointing:
        # transformers 5.2x renamed it (the old name warns); the lowest supported, 4.56, has only the old one.
        enable = getattr(base, "activation_checkpointing_enable", None)
        if enable is not None:
            enable({"use_reentrant": False})
        else:
            base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        base.config.use_cache = False  # nothing decodes in a train step; transformers warns otherwise
    return base


def load_policy(
    base_dir: ModelDir,
    files: Mapping[str, bytes],
    *,
    trainable: bool,
    device: str | torch.device = "cpu",
    config: TrainerConfig | None = None,
) -> PeftModel:
    """The opened base model `base_dir` (held as `config` says; float32 and eager when None) with the adapter in `files`
    applied, on `device`; frozen unless `trainable`. The adapter's weights load as float32 whatever the base."""
    missing = [name for name in ADAPTER_FILES if name not in files]
    if missing:
        raise AdapterArtifactError(
            f"adapter artifact lacks {', '.join(missing)} (has {sorted(files)}); pass an adapter produced by "
            "PeftTrainer.init_adapter or train_step"
        )
    check_adapter_files("adapter artifact", files)  # a pickle, a regex target, a damaged header: refused first
    # Straight onto the device: no host copy of the base.
    base = base_model(base_dir, config, device) if config is not None else load_base_model(base_dir, device=device)
    with tempfile.TemporaryDirectory(prefix="adapter-") as tmp:
        for name in ADAPTER_FILES:
            (Path(tmp) / name).write_bytes(files[name])
        with _quiet_peft():
            try:
                model = PeftModel.from_pretrained(base, tmp, is_trainable=trainable, trust_remote_code=False)
            except LOADER_ERRORS as exc:
                raise AdapterDirError(
                    f"adapter artifact cannot be loaded ({shown(exc, 300)}); pass an adapter a trainer's init_adapter "
                    "or train_step returned"
                ) from exc
    return model.to(device)  # the adapter's weights too (PEFT loads them beside the base; a no-op then)


def adapter_files(model: PeftModel) -> dict[str, bytes]:
    """The adapter's weights and config as artifact files, byte-identical for equal weights and equal LoRA config.

    The config is rewritten canonically: `target_modules` sorted (PEFT writes it in set order), keys sorted, and
    `base_model_name_or_path` cleared so the bytes do not depend on where the base model lives on this machine. The
    weights are the bytes `save_pretrained` writes (`tests/test_peft_trainer.py` checks it), serialised in memory: a
    step's adapter would otherwise pay for a temporary directory and a generated model card every time.
    """
    config = _CANONICAL_CONFIG.get(model)
    if config is None:
        with tempfile.TemporaryDirectory(prefix="adapter-") as tmp:
            model.save_pretrained(tmp)
            written = json.loads((Path(tmp) / "adapter_config.json").read_text())
        if isinstance(written.get("target_modules"), list):
            written["target_modules"] = sorted(written["target_modules"])
        written["base_model_name_or_path"] = None
        config = (json.dumps(written, indent=2, sort_keys=True, allow_nan=False) + "\n").encode()
        _CANONICAL_CONFIG[model] = config  # a model's LoRA config never changes; its weights do
    weights = {name: t.detach().contiguous().cpu() for name, t in _adapter_tensors(model)}
    return {
        "adapter_config.json": config,
        "adapter_model.safetensors": save_safetensors(weights, metadata={"format": "pt"}),
    }


_CANONICAL_CONFIG: weakref.WeakKeyDictionary[PeftModel, bytes] = weakref.WeakKeyDictionary()
_SAVED_TENSORS: weakref.WeakKeyDictionary[PeftModel, list[tuple[str, torch.Tensor]]] = weakref.WeakKeyDictionary()


def _adapter_tensors(model: PeftModel) -> list[tuple[str, torch.Tensor]]:
    """`get_peft_model_state_dict(model)` as (saved name, live parameter) pairs. PEFT's function walks the whole
    model's state dict on every call; the parameters it picks are looked up once per model, by storage."""
    pairs = _SAVED_TENSORS.get(model)
    if pairs is None:
        by_ptr = {p.data_ptr(): p for p in model.parameters()}
        saved = get_peft_model_state_dict(model)
        found = [(key, by_ptr.get(t.data_ptr())) for key, t in saved.items()]
        if not all(p is not None for _, p in found):
            return list(saved.items())  # not all plain parameters (never for LoRA): PEFT's dict every time
        pairs = [(key, p) for key, p in found if p is not None]
        _SAVED_TENSORS[model] = pairs
    return pairs


def trainable_parameters(model: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
    """The LoRA parameters in module order: the order the optimizer state's indices refer to."""
    return [(name, p) for name, p in model.named_parameters() if p.requires_grad]
