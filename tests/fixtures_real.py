"""Shared fixtures for the real CPU stack's tests: one tiny base model and one version-0 LoRA adapter per session.

Imported by the test modules that need them (`from fixtures_real import ...`: pytest puts tests/ on sys.path), not
registered in conftest.py, so suites that do not use the real stack do not pay for building it.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from pathlib import Path

import pytest

from rl.models import TinyModelConfig, build_tiny_model

# Small enough that a forward pass costs well under a millisecond per token on one thread.
TEST_MODEL_CONFIG = TinyModelConfig(seed=7, hidden_size=32, layers=2, heads=4, kv_heads=2, intermediate=64)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A base model directory built from `TEST_MODEL_CONFIG`; read-only by convention (tests must not modify it)."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"), TEST_MODEL_CONFIG)
