"""`rl bench --sections vllm --model smollm2`: vLLM's CPU build against our torch sampler on a real model, on the
requests `rl demo grpo --model` sends, interleaved.

Three cases, each one `generate_groups` call on each engine with the same requests (`rl.deploy.demo.grpo_demo_config`'s
real-model settings: temperature 1, `max_tokens` 12, the chat template, stop at the model's end-of-turn): `group`
(one training prompt x 8 samples), `iteration` (4 training prompts x 8) and `heldout` (every held-out problem of
`rl.problems.Addition` x 8, as the demo's `SamplingEvaluator` sends them). The policy is a rank-8 adapter on q/k/v/o
(`REAL_MODEL_TRAINER`) with small random B, standing in for a trained one. After one warm-up call per engine (the
group case: adapter load, first-call overheads), each repeat times every case on both engines, the engine that goes
first alternating. Figures: each case's seconds per call on each engine and the per-repeat ratio vLLM / torch (medians,
min-max), the completion tokens per call, and vLLM's start-up separately. Results: docs/benchmarks.md.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rl.bench.figures import spread
from rl.bench.vllm_cpu import require_vllm

if TYPE_CHECKING:
    from rl.models.opened_model import ModelDir

__all__ = ["CASES", "real_model_requests", "trained_like_adapter", "vllm_real_model_bench"]

CASES = ("group", "iteration", "heldout")


def real_model_requests(adapter: Any) -> dict[str, list[Any]]:
    """Each case's requests, with `rl demo grpo --model`'s group size, `max_tokens` and held-out seeds."""
    from rl.deploy.demo import grpo_demo_config
    from rl.deploy.local import demo_problems
    from rl.seeding import eval_problem_seed
    from rl.types import RolloutRequest

    config = grpo_demo_config(iterations=1, real_model=True, prompts=4)
    problems = demo_problems(real_model=True)
    train, held_out = problems.train_prompts(), problems.eval_prompts()

    def requests(prompts: Sequence[Any], n: int, seed: Callable[[int], int]) -> list[Any]:
        return [
            RolloutRequest(
                group_id=i,
                prompt=p,
                n=n,
                adapter=adapter,
                policy_version=1,
                seed=seed(i),
                max_tokens=config.max_tokens,
            )
            for i, p in enumerate(prompts)
        ]

    return {
        "group": requests(train[:1], config.group_size, lambda i: 1000 + i),
        "iteration": requests(train[: config.prompts_per_iteration], config.group_size, lambda i: 1000 + i),
        "heldout": requests(held_out, config.eval_k, lambda i: eval_problem_seed(config.seed, i)),
    }


def _timed(call: Callable[[], Coroutine[Any, Any, list[list[Any]]]]) -> tuple[float, int]:
    """(seconds, completion tokens) of one call."""
    start = time.perf_counter()
    groups = asyncio.run(call())
    return time.perf_counter() - start, sum(len(r.token_ids) for g in groups for r in g)


def vllm_real_model_bench(model: str, *, repeats: int = 3) -> dict[str, Any]:
    """The figures of the module docstring on `model` (a pinned name such as `smollm2`, or a model directory)."""
    import tempfile

    import torch

    from rl.deploy.local import REAL_MODEL_TRAINER, make_engine
    from rl.models.pretrained import resolve_model
    from rl.samplers.torch_sampler import TorchSampler
    from rl.storage.artifacts import LocalArtifacts

    require_vllm()
    base = resolve_model(model)
    with tempfile.TemporaryDirectory(prefix="rl-bench-vllm-real-") as tmp:
        store = LocalArtifacts(Path(tmp) / "artifacts")
        adapter = asyncio.run(store.put(trained_like_adapter(base), name="bench-adapter"))
        cases = real_model_requests(adapter)
        # The demo's two engines, as `rl demo grpo --model --engine torch|vllm` makes them (both on 2 threads).
        sampler = TorchSampler(base, store, threads=REAL_MODEL_TRAINER.threads)
        engine: Any = make_engine("vllm", base, store, REAL_MODEL_TRAINER.threads)  # a VLLMEngine
        try:
            start = time.perf_counter()
            _ = engine.llm
            figures: dict[str, Any] = {"vllm_real_start_s": time.perf_counter() - start}
            _progress(f"vLLM started in {figures['vllm_real_start_s']:.1f} s")
            engines = {"vllm": engine, "torch": sampler}
            calls = {
                (name, case): (lambda e=e, r=requests: e.generate_groups(r))
                for name, e in engines.items()
                for case, requests in cases.items()
            }
            for name in engines:  # warm-up, the group case: adapter load and merge, first-call overheads
                figures[f"vllm_real_{name}_first_s"] = _timed(calls[(name, "group")])[0]
                _progress(f"warm-up (group) on {name}: {figures[f'vllm_real_{name}_first_s']:.1f} s")
            seconds: dict[tuple[str, str], list[float]] = {key: [] for key in calls}
            tokens: dict[tuple[str, str], list[int]] = {key: [] for key in calls}
            for r in range(repeats):
                for case in CASES:
                    for name in ("vllm", "torch") if r % 2 == 0 else ("torch", "vllm"):
                        s, t = _timed(calls[(name, case)])
                        seconds[(name, case)].append(s)
                        tokens[(name, case)].append(t)
                        _progress(f"repeat {r + 1}/{repeats} {case} on {name}: {s:.1f} s, {t} tokens")
            torch_threads = torch.get_num_threads()  # after vLLM's start, in this process
        finally:
            engine.close()
    for case in CASES:
        for name in ("vllm", "torch"):
            figures.update(spread(f"vllm_real_{case}_{name}_s", seconds[(name, case)]))
            figures[f"vllm_real_{case}_{name}_tokens"] = sum(tokens[(name, case)]) / repeats
        ratios = [v / t for v, t in zip(seconds[("vllm", case)], seconds[("torch", case)], strict=True)]
        figures.update(spread(f"vllm_real_{case}_vllm_over_torch", ratios))
    figures["vllm_real_shape"] = (
        f"{model}: group {_shape(cases['group'])}, iteration {_shape(cases['iteration'])}, heldout "
        f"{_shape(cases['heldout'])}; <= {cases['group'][0].max_tokens} tokens, float32, {repeats} repeats; "
        f"torch sampler threads {torch_threads}"
    )
    return figures


def _progress(line: str) -> None:
    """One line per timed call on stderr: the section takes minutes on a real model."""
    print(f"vllm --model: {line}", file=sys.stderr, flush=True)


def _shape(requests: list[Any]) -> str:
    return f"{len(requests)} x {requests[0].n}"


def trained_like_adapter(base: ModelDir) -> dict[str, bytes]:
    """The demo's adapter shape (`REAL_MODEL_TRAINER`: r8 on q/k/v/o) with B drawn from N(0, 0.02^2), seeded: a
    stand-in for a trained version (a fresh one has B = 0 and samples as the base). vllm_cpu_tests use it too."""
    import torch

    from rl.deploy.local import REAL_MODEL_TRAINER
    from rl.trainer.adapter import adapter_files, new_adapter, trainable_parameters

    model = new_adapter(base, REAL_MODEL_TRAINER, seed=0)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in trainable_parameters(model):
            if "lora_B" in name:
                p.copy_(0.02 * torch.randn(p.shape, generator=generator))
    return adapter_files(model)
