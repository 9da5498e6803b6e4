"""The tiny base model the laws default to (the DDP shard-step law's policy) and our CPU bindings sample and train,
built once per process into a temporary directory removed at exit."""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from pathlib import Path

__all__ = ["temp_dir", "tiny_base_model"]


def temp_dir(prefix: str) -> Path:
    """A new temporary directory, removed when the process exits."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


@functools.cache
def tiny_base_model() -> Path:
    """A tiny base model (the test suite's shape), built once per process into a temporary directory."""
    from rl.models import TinyModelConfig, build_tiny_model

    config = TinyModelConfig(seed=7, hidden_size=32, layers=2, heads=4, kv_heads=2, intermediate=64)
    return build_tiny_model(temp_dir("rl-conformance-model-") / "base", config)
