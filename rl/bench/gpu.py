"""`rl bench --gpu`: the vLLM sampler's tokens/s against Hugging Face `generate` on the same model, and the CUDA train
step's time, measured side by side in one process on one GPU.

The model is `rl.gpu.VLLM_MODEL`, the policy its version-0 LoRA adapter. Both samplers draw the same work (every digit
prompt, `n` samples each, exactly `max_tokens` new tokens, temperature 1, bf16, one call); the train step is
`PeftTrainer(device="cuda").compute_step` on the HF samples. Each figure is the median of `repeats` timed runs after
one warm-up. Without CUDA nothing is measured and the command exits 2 with the reason; without vllm the HF and
train-step figures are printed and it exits 1. How each side is set up:
docs/benchmarks.md#how-the-other-sections-measure.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import asyncio
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rl.bench.figures import figure_lines
from rl.gpu import (
    VLLM_MODEL,
    cuda_unavailable_reason,
    vllm_enforce_eager,
    vllm_llm_kwargs,
    vllm_unavailable_reason,
)
from rl.strict_json import flag_non_finite

if TYPE_CHECKING:
    from rl.models.opened_model import ModelDir

__all__ = ["GpuBenchConfig", "bench_config", "gpu_bench", "run_gpu_bench"]


@dataclass(frozen=True)
class GpuBenchConfig:
    prompts: int = 10  # the ten digit prompts "0=" .. "9="
    n: int = 8  # samples per prompt (the GRPO group size)
    max_tokens: int = 64  # new tokens per sample, exactly
    repeats: int = 3
    gpu_memory_utilization: float = 0.3
    enforce_eager: bool | None = None  # None: rl.gpu.vllm_enforce_eager's choice, production's (RL_FLYTE_REUSE)


def _median_seconds(fn: Callable[[], Any], repeats: int, sync: Callable[[], None]) -> tuple[float, Any]:
    fn()  # warm-up: kernels, allocator, CUDA graphs
    sync()
    times, out = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times), out


def bench_config(config: GpuBenchConfig) -> GpuBenchConfig:
    """`config` with `enforce_eager` resolved as production resolves it (`rl.gpu.vllm_enforce_eager`)."""
    if config.enforce_eager is not None:
        return config
    from rl.deploy.flyte.config import reuse_enabled

    return replace(config, enforce_eager=vllm_enforce_eager(reuse=reuse_enabled()))


def gpu_bench(config: GpuBenchConfig = GpuBenchConfig(), *, with_vllm: bool = True) -> dict[str, Any]:
    """Measure and return the figures (see the module docstring). Needs CUDA; vLLM only when `with_vllm`."""
    import torch

    from rl.trainer.adapter import load_policy

    device = torch.device("cuda", 0)
    config = bench_config(config)
    figures: dict[str, Any] = {"gpu": torch.cuda.get_device_name(device), **asdict(config)}
    with tempfile.TemporaryDirectory(prefix="rl-bench-gpu-") as tmp:
        bench = _setup(Path(tmp), config, device)
        if with_vllm:
            figures.update(_vllm_figures(bench, config))
        # merge_and_unload and .to() change a model in place: HF gets its own copy, the float32 one scores the batch.
        policy = load_policy(bench.base, bench.adapter, trainable=False, device=device).eval()
        hf_figures, completions = _hf_generate_figures(bench, config)
        figures.update(hf_figures)
        if "vllm_tokens_per_s" in figures:
            figures["vllm_speedup"] = round(figures["vllm_tokens_per_s"] / figures["hf_generate_tokens_per_s"], 2)
        figures.update(_train_step_figures(bench, config, _rollouts(bench, config, policy, completions)))
    return figures


@dataclass(frozen=True)
class _Bench:
    """What every measurement shares: the model, its version-0 adapter and the trainer that made it, the prompts."""

    root: Path
    base: ModelDir
    device: Any  # torch.device
    tokenizer: Any
    trainer: Any  # PeftTrainer
    init: Any  # TrainResult: the version-0 adapter's and optimizer state's refs
    adapter: dict[str, bytes]
    opt_state: dict[str, bytes] | None
    questions: list[str]
    prompt_ids: list[list[int]]
    tokens: int  # new tokens in one call: prompts x n x max_tokens

    def sync(self) -> None:
        import torch

        torch.cuda.synchronize(self.device)


def _setup(root: Path, config: GpuBenchConfig, device: Any) -> _Bench:
    """Build the model under `root`, its version-0 adapter on `device`, and the prompts' token ids."""
    from rl.models import build_tiny_model, load_tokenizer
    from rl.models.opened_model import open_model
    from rl.storage.artifacts import LocalArtifacts
    from rl.trainer.config import TrainerConfig
    from rl.trainer.peft_trainer import PeftTrainer

    base = open_model(build_tiny_model(root / "model", VLLM_MODEL))
    tokenizer = load_tokenizer(base)
    artifacts = LocalArtifacts(root / "artifacts")
    trainer = PeftTrainer(base, artifacts, TrainerConfig(lr=1e-3), device=device)
    init = asyncio.run(trainer.init_adapter(seed=0))
    adapter = asyncio.run(artifacts.get(init.adapter))
    opt_state = asyncio.run(artifacts.get(init.optimizer_state)) if init.optimizer_state else None
    questions = [f"{d % 10}=" for d in range(config.prompts)]
    prompt_ids = [[int(t) for t in tokenizer(q)["input_ids"]] for q in questions]
    tokens = config.prompts * config.n * config.max_tokens
    return _Bench(root, base, device, tokenizer, trainer, init, adapter, opt_state, questions, prompt_ids, tokens)


def _vllm_figures(bench: _Bench, config: GpuBenchConfig) -> dict[str, Any]:
    """vLLM's start-up and sampling time, the adapter as a `LoRARequest`; the engine is gone when this returns."""
    import vllm
    from vllm.lora.request import LoRARequest

    adapter_dir = bench.root / "adapter-v0"
    adapter_dir.mkdir()
    for name, content in bench.adapter.items():
        (adapter_dir / name).write_bytes(content)
    eager = bool(bench_config(config).enforce_eager)  # production's choice unless the config names one
    kwargs = vllm_llm_kwargs(gpu_memory_utilization=config.gpu_memory_utilization, enforce_eager=eager)
    start = time.perf_counter()
    llm = vllm.LLM(model=str(bench.base.where), enable_lora=True, **kwargs)
    figures: dict[str, Any] = {"vllm_startup_s": round(time.perf_counter() - start, 1)}
    lora = LoRARequest("policy-v0", 1, str(adapter_dir))
    sampling = vllm.SamplingParams(
        n=config.n,
        temperature=1.0,
        top_p=1.0,
        seed=0,
        logprobs=0,
        max_tokens=config.max_tokens,
        ignore_eos=True,
    )
    requests = [{"prompt_token_ids": ids} for ids in bench.prompt_ids]

    def vllm_generate() -> int:
        outputs = llm.generate(requests, sampling, lora_request=lora, use_tqdm=False)
        return sum(len(c.token_ids) for o in outputs for c in o.outputs)

    seconds, produced = _median_seconds(vllm_generate, config.repeats, bench.sync)
    if produced != bench.tokens:
        raise RuntimeError(f"vLLM produced {produced} tokens, expected {bench.tokens} (ignore_eos was not honoured)")
    figures["vllm_s"] = round(seconds, 4)
    figures["vllm_tokens_per_s"] = round(bench.tokens / seconds, 1)
    return figures


def _hf_generate_figures(bench: _Bench, config: GpuBenchConfig) -> tuple[dict[str, Any], list[list[int]]]:
    """Hugging Face `generate`'s sampling time on the merged bf16 model, and the completions of its last call."""
    import torch

    from rl.trainer.adapter import load_policy

    hf_model = load_policy(bench.base, bench.adapter, trainable=False, device=bench.device).merge_and_unload()
    hf_model = hf_model.to(torch.bfloat16).eval()
    rows = [ids for ids in bench.prompt_ids for _ in range(config.n)]
    input_ids = torch.tensor(rows, device=bench.device)  # [P*n, 3]
    torch.manual_seed(0)

    @torch.inference_mode()
    def hf_generate() -> Any:
        return hf_model.generate(
            input_ids=input_ids,
            attention_mask=torch.ones_like(input_ids),
            do_sample=True,
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            max_new_tokens=config.max_tokens,
            min_new_tokens=config.max_tokens,
            pad_token_id=bench.tokenizer.pad_token_id,
            eos_token_id=bench.tokenizer.eos_token_id,
        )

    seconds, generated = _median_seconds(hf_generate, config.repeats, bench.sync)
    figures = {"hf_generate_s": round(seconds, 4), "hf_generate_tokens_per_s": round(bench.tokens / seconds, 1)}
    return figures, generated[:, input_ids.shape[1] :].tolist()


def _rollouts(bench: _Bench, config: GpuBenchConfig, policy: Any, completions: list[list[int]]) -> list[Any]:
    """The completions as version-0 rollouts, old log-probs teacher-forced by `policy`, so ratios start at 1."""
    import torch

    from rl.samplers.decoding import teacher_forced_logprobs
    from rl.types import Rollout

    rollouts = []
    with torch.no_grad():
        for i, completion in enumerate(completions):
            group = i // config.n
            ids = bench.prompt_ids[group]
            old = teacher_forced_logprobs(policy, ids, completion).tolist()
            rollouts.append(
                Rollout(
                    group_id=group,
                    question=bench.questions[group],
                    answer=str((group + 1) % 10),
                    completion="",
                    prompt_token_ids=ids,
                    token_ids=completion,
                    logprobs=old,
                    policy_version=0,
                    seed=0,
                )
            )
    return rollouts


def _train_step_figures(bench: _Bench, config: GpuBenchConfig, rollouts: list[Any]) -> dict[str, Any]:
    """The CUDA train step's time on `rollouts`, with rewards distinct within every group (all contribute)."""
    from rl.types import TrainBatch

    rewards = [float(i % config.n) for i in range(len(rollouts))]  # distinct within every group: all contribute
    batch = TrainBatch(
        step=0,
        rollouts=rollouts,
        rewards=rewards,
        adapter=bench.init.adapter,
        optimizer_state=bench.init.optimizer_state,
        new_version=1,
    )
    seconds, (_, _, metrics) = _median_seconds(
        lambda: bench.trainer.compute_step(batch, bench.adapter, bench.opt_state), config.repeats, bench.sync
    )
    return {
        "train_step_s": round(seconds, 4),
        "train_samples": metrics.contributing,
        "train_tokens_per_s": round(bench.tokens / seconds, 1),
    }


def run_gpu_bench(*, json_out: bool = False, config: GpuBenchConfig = GpuBenchConfig()) -> int:
    """Print the GPU figures; 0 when all were measured, 1 when vLLM is missing, 2 (nothing measured) without CUDA."""
    reason = cuda_unavailable_reason(1)
    if reason is not None:
        print(f"rl bench --gpu: {reason}. Run it on a machine with an NVIDIA GPU (e.g. an L4).", file=sys.stderr)
        return 2
    vllm_reason = vllm_unavailable_reason()
    figures = gpu_bench(config, with_vllm=vllm_reason is None)
    for line in figure_lines(figures):
        print(line)
    if json_out:
        print(json.dumps(flag_non_finite(figures), allow_nan=False))
    if vllm_reason is not None:
        print(f"rl bench --gpu: the vLLM sampler was not measured: {vllm_reason}", file=sys.stderr)
        return 1
    return 0
