"""A warm rollout replica (`RL_FLYTE_REUSE=1`) that is asked for another engine (another base model or engine spec)
closes the resident one first: vLLM checks free GPU memory when an `LLM` starts, and at 0.85 utilisation two cannot
share a GPU. Run on the vLLM stub inside `one_gpu()`, which refuses a second engine as vLLM does."""

from __future__ import annotations

import asyncio
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from fixtures_real import tiny_model_dir

import fakes.vllm_stub as vllm_stub
import fakes.vllm_stub.lora.request as vllm_stub_lora_request

__all__ = ["tiny_model_dir"]

pytestmark = pytest.mark.flyte


@pytest.fixture
def stub_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    """`import vllm` finds the stub, as the engine imports it lazily by name."""
    monkeypatch.setitem(sys.modules, "vllm", vllm_stub)
    monkeypatch.setitem(sys.modules, "vllm.lora.request", vllm_stub_lora_request)


def test_the_stub_like_vllm_refuses_a_second_engine_while_the_first_holds_the_gpu(tiny_model_dir: Path) -> None:
    with vllm_stub.one_gpu():
        first = vllm_stub.LLM(model=str(tiny_model_dir), gpu_memory_utilization=0.85)
        with pytest.raises(ValueError, match="less than desired GPU memory utilization"):
            vllm_stub.LLM(model=str(tiny_model_dir), gpu_memory_utilization=0.85)
        first.llm_engine.engine_core.shutdown()
        vllm_stub.LLM(model=str(tiny_model_dir), gpu_memory_utilization=0.85)


def test_a_warm_replica_closes_its_engine_before_starting_the_next(tiny_model_dir: Path, stub_vllm: None) -> None:
    from flyte.io import Dir

    from rl.deploy.flyte import grpo_tasks
    from rl.deploy.flyte.config import EngineSpec

    base = Dir.from_existing_remote(str(tiny_model_dir), dir_cache_key="sha256:" + "1" * 64)
    spec = EngineSpec(kind="vllm", gpu_memory_utilization=0.85)
    grpo_tasks._ENGINES.clear()
    try:
        with vllm_stub.one_gpu() as gpu:
            first = asyncio.run(grpo_tasks.engine_for(base, spec))
            first_llm = first.llm  # type: ignore[attr-defined]  # the LLM starts on first use
            second = asyncio.run(grpo_tasks.engine_for(base, replace(spec, max_lora_rank=8)))
            assert second is not first
            assert first_llm.llm_engine.engine_core.shutdowns == 1
            assert second.llm is not None  # type: ignore[attr-defined]  # the one-GPU check refuses it if the first held on
            assert len(gpu.held) == 1
            assert asyncio.run(grpo_tasks.engine_for(base, replace(spec, max_lora_rank=8))) is second
    finally:
        for engine in grpo_tasks._ENGINES.values():
            engine.close()  # type: ignore[attr-defined]
        grpo_tasks._ENGINES.clear()
