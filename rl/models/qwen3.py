"""A small model of the real family, built offline: Qwen3's architecture and file layout at a fraction of its size.

What the stress profile trains (Qwen3-8B) differs from the tiny CPU model in ways that break a first real run: its
weights are bfloat16 and come in shards beside `model.safetensors.index.json`; its heads are 128 wide (with q/k
RMS-norms, so `hidden_size != heads * head_dim`); its output layer spans a 151,936-token vocabulary, which is what
sizes a train step's logits. `build_qwen3_model` writes a model with exactly those properties, and only the depth and
width shrunk, so the loader, the trainer and `rl plan` meet them on a CPU: nothing reaches for a hub.

The tokenizer is the character tokenizer of `rl.models.tiny` (50 tokens); the model's vocabulary is padded past it to
the real size, as Qwen3's own config (151,936) is padded past its tokenizer (151,669).
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, Qwen3Config

from rl.errors import InputError
from rl.models.tiny import build_tokenizer, declare_tokenizer_class

__all__ = ["QWEN3_8B", "Qwen3ModelConfig", "build_qwen3_model", "qwen3_config"]


@dataclass(frozen=True)
class Qwen3ModelConfig:
    """A Qwen3 architecture: the published 8B's numbers are `QWEN3_8B`; a test model shrinks layers and widths."""

    hidden_size: int = 64
    layers: int = 2
    heads: int = 2
    kv_heads: int = 1
    head_dim: int = 128
    intermediate: int = 128
    vocab_size: int = 151_936
    max_position: int = 1024
    seed: int = 0
    initializer_range: float = 0.02

    def __post_init__(self) -> None:
        for name in ("hidden_size", "layers", "heads", "kv_heads", "head_dim", "intermediate", "max_position"):
            if getattr(self, name) <= 0:
                raise InputError(f"Qwen3ModelConfig.{name} must be positive, got {getattr(self, name)}")
        if self.heads % self.kv_heads:
            raise InputError(f"Qwen3ModelConfig.heads ({self.heads}) must be divisible by kv_heads ({self.kv_heads})")
        if self.vocab_size < len(build_tokenizer()):
            raise InputError(f"Qwen3ModelConfig.vocab_size must cover the tokenizer's {len(build_tokenizer())} tokens")


QWEN3_8B = Qwen3ModelConfig(
    hidden_size=4096, layers=36, heads=32, kv_heads=8, head_dim=128, intermediate=12288, max_position=40960
)
"""Qwen/Qwen3-8B's config.json: 8.19 B parameters, untied embeddings, bfloat16."""


def qwen3_config(config: Qwen3ModelConfig) -> Qwen3Config:
    """The transformers config of `config` (ours), with the character tokenizer's special ids."""
    tokenizer = build_tokenizer()
    return Qwen3Config(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        num_hidden_layers=config.layers,
        num_attention_heads=config.heads,
        num_key_value_heads=config.kv_heads,
        head_dim=config.head_dim,
        intermediate_size=config.intermediate,
        max_position_embeddings=config.max_position,
        initializer_range=config.initializer_range,
        tie_word_embeddings=False,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )


def build_qwen3_model(
    out_dir: Path, config: Qwen3ModelConfig = Qwen3ModelConfig(), *, max_shard_size: str = "8MB"
) -> Path:
    """Write a Qwen3 model directory for `config`: config.json, bfloat16 weights in shards of at most
    `max_shard_size` (`model-0000N-of-0000M.safetensors` plus `model.safetensors.index.json`, as the real models ship),
    the character tokenizer. A pure function of `config`; the global torch RNG is forked, not consumed. Returns
    `out_dir`."""
    out_dir = Path(out_dir)
    tokenizer = build_tokenizer()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        model = AutoModelForCausalLM.from_config(qwen3_config(config), dtype=torch.bfloat16)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True, max_shard_size=max_shard_size)
    tokenizer.save_pretrained(out_dir)
    declare_tokenizer_class(out_dir / "tokenizer_config.json")
    return out_dir
