"""Tiny causal LMs built offline from a seed: the base model the CPU stack samples from and trains adapters on."""

from rl.models.tiny import (
    CHARACTERS,
    ModelDirError,
    TinyModelConfig,
    build_tiny_model,
    build_tokenizer,
    load_base_model,
    load_tokenizer,
)

__all__ = [
    "CHARACTERS",
    "ModelDirError",
    "TinyModelConfig",
    "build_tiny_model",
    "build_tokenizer",
    "load_base_model",
    "load_tokenizer",
]
