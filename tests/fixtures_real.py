"""Shared fixtures for the real CPU stack's tests: one tiny base model and one version-0 LoRA adapter per session.

Imported by the test modules that need them (`from fixtures_real import ...`: pytest puts tests/ on sys.path), not
registered in conftest.py, so suites that do not use the real stack do not pay for building it.
"""

from __future__ import annotations

import asyncio
import os
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from rl.models import TinyModelConfig, build_tiny_model
from rl.models.opened_model import open_model
from rl.storage.artifacts import LocalArtifacts
from rl.types import ArtifactRef

# Small enough that a forward pass costs well under a millisecond per token on one thread.
TEST_MODEL_CONFIG = TinyModelConfig(seed=7, hidden_size=32, layers=2, heads=4, kv_heads=2, intermediate=64)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A base model directory built from `TEST_MODEL_CONFIG`; read-only by convention (tests must not modify it)."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"), TEST_MODEL_CONFIG)


LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def make_adapter_dir(model_dir: Path, out_dir: Path, *, seed: int, identity: bool) -> Path:
    """Save a LoRA adapter (rank 4, all linear layers) for the base model in `model_dir` with PEFT directly.

    `identity=True` is what a trainer's version 0 is (B = 0, so the policy equals the base model); `identity=False`
    draws A and B at random so the adapter visibly changes the logits, standing in for a trained version.
    """
    import torch
    from peft import LoraConfig, get_peft_model

    from rl.models import load_base_model

    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        torch.manual_seed(seed)
        model = get_peft_model(
            load_base_model(open_model(model_dir, tokenizer=False)),
            LoraConfig(r=4, lora_alpha=8, target_modules=LORA_TARGETS, lora_dropout=0.0, init_lora_weights=identity),
        )
    model.save_pretrained(out_dir)
    return out_dir


@pytest.fixture(scope="session")
def adapter_dirs(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two adapters for `tiny_model_dir`: "v0" (identity, like a trainer's init) and "trained" (random A and B)."""
    root = tmp_path_factory.mktemp("adapters")
    return {
        "v0": make_adapter_dir(tiny_model_dir, root / "v0", seed=0, identity=True),
        "trained": make_adapter_dir(tiny_model_dir, root / "trained", seed=1, identity=False),
    }


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(coro)


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """Bitwise comparisons hold for a fixed intra-op thread count; pin it and restore the caller's."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> LocalArtifacts:
    return LocalArtifacts(tmp_path_factory.mktemp("store"))


@pytest.fixture(scope="module")
def refs(store: LocalArtifacts, adapter_dirs: dict[str, Path]) -> dict[str, ArtifactRef]:
    """Each adapter directory of `adapter_dirs`, put into the module's artifact store."""
    return {name: run(store.put_dir(path, f"adapter-{name}")) for name, path in adapter_dirs.items()}


@pytest.fixture
def one_rank_group() -> Iterator[None]:
    """A one-rank gloo process group on a free local port, for the test's duration."""
    import socket
    from datetime import timedelta

    import torch.distributed as dist

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1, timeout=timedelta(seconds=60)
    )
    try:
        yield
    finally:
        dist.destroy_process_group()
