"""The base models the CPU stack samples from and trains adapters on: tiny causal LMs built offline from a seed, a
small Qwen3 of the real layout, the pinned real model (SmolLM2) and any checked model directory."""

from rl.models.tiny import (
    CHARACTERS,
    TinyModelConfig,
    build_tiny_model,
    build_tokenizer,
    load_base_model,
    load_tokenizer,
)

__all__ = [
    "CHARACTERS",
    "TinyModelConfig",
    "build_tiny_model",
    "build_tokenizer",
    "load_base_model",
    "load_tokenizer",
]
