"""A memory plan for a run's GPU tasks, on paper: what the trainer and the rollout engine will hold, before anyone books
a GPU (`rl plan`).

Every figure is a formula over the model's architecture and the run's settings, in bytes, written out term by term so
a reader can check it against what the code does (`tests/test_memory_plan.py` checks it against allocations measured on
the CPU for small models). The terms: **weights** (the base at `base_dtype`, float32 LoRA; vLLM's LoRA slots),
**optimizer** (LoRA gradients and AdamW's two moments), **activations** of one micro-batch (what autograd keeps for
backward with a frozen base, or one layer's under gradient checkpointing), **logits** (the output layer over the
micro-batch and the larger of the forward's and backward's [B, T, V] tensors) and the engine's **KV cache** (what
`gpu_memory_utilization` leaves after vLLM's weights, activation peak and CUDA context). What each term counts, element
by element: docs/gpu.md#what-rl-plan-counts.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rl.errors import InputError, UnknownGpuError

__all__ = [
    "GPUS",
    "GpuSpec",
    "ModelArch",
    "TaskPlan",
    "engine_plan",
    "lora_parameters",
    "trainer_plan",
    "vllm_batch_defaults",
]

GIB = 1 << 30
MIB = 1 << 20
CUDA_CONTEXT_BYTES = 1 * GIB  # the CUDA context, cuBLAS workspaces and the caching allocator's slack, per process
ALL_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# vLLM 0.33's batch defaults for `LLM(...)`, which our engine leaves alone
# (rl.deploy.flyte.config.EngineSpec.vllm_kwargs): `EngineArgs.get_batch_defaults` (vllm/engine/arg_utils.py) picks them
# by the GPU's memory and name, see `vllm_batch_defaults`. (max_num_seqs, max_num_batched_tokens) for
# UsageContext.LLM_CLASS:
VLLM_SMALL_GPU_BATCH = (256, 8192)
VLLM_LARGE_GPU_BATCH = (1024, 16384)  # >= 160 GiB, or >= 70 GiB and not an A100 (nor a GB10)


@dataclass(frozen=True)
class GpuSpec:
    """A GPU model: its name as Flyte's `GPUType` spells it (`RL_FLYTE_GPU` feeds both `flyte.GPU` and `rl plan`) and
    the memory `nvidia-smi` reports for it."""

    name: str
    memory_mib: int

    @property
    def memory_bytes(self) -> int:
        return self.memory_mib * MIB


# Keyed by Flyte's exact spelling (flyte-sdk `src/flyte/_resources.py`, `GPUType`), which `flyte.GPU` checks exactly.
GPUS: dict[str, GpuSpec] = {
    g.name: g
    for g in (
        GpuSpec("T4", 15360),
        GpuSpec("A10G", 23028),
        GpuSpec("L4", 23034),
        GpuSpec("L40s", 46068),
        GpuSpec("A100", 40960),
        GpuSpec("A100_80G", 81920),
        GpuSpec("H100", 81559),
        GpuSpec("H200", 143771),
    )
}


def _folded(name: str) -> str:
    return "".join(c for c in name.lower() if c.isalnum())


def gpu(name: str) -> GpuSpec:
    """The GPU spelt `name` exactly as Flyte spells it; any other spelling is refused, naming Flyte's."""
    if name in GPUS:
        return GPUS[name]
    near = [g.name for g in GPUS.values() if _folded(g.name) == _folded(name)]
    hint = f"Flyte spells it {near[0]!r}" if near else f"choose one of {', '.join(GPUS)}"
    raise UnknownGpuError(f"unknown GPU {name!r} (RL_FLYTE_GPU / --gpu take Flyte's GPUType names); {hint}")


def vllm_batch_defaults(device: GpuSpec) -> tuple[int, int]:
    """(max_num_seqs, max_num_batched_tokens) that vLLM 0.33's `LLM` picks on `device` (EngineArgs.get_batch_defaults:
    the large tier from 160 GiB, or from 70 GiB unless the device's name holds "a100" or it is a GB10)."""
    memory, name = device.memory_bytes, device.name.lower()
    if memory >= 160 * GIB or (memory >= 70 * GIB and "a100" not in name and name != "gb10"):
        return VLLM_LARGE_GPU_BATCH
    return VLLM_SMALL_GPU_BATCH


@dataclass(frozen=True)
class ModelArch:
    """The numbers of a decoder-only transformer (Qwen2 or Qwen3) that memory depends on."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied_embeddings: bool = False
    qk_norm: bool = False  # Qwen3 normalises q and k per head
    qkv_bias: bool = False  # Qwen2 has biases on q, k, v

    @classmethod
    def from_hf_config(cls, config: Mapping[str, Any]) -> ModelArch:
        """From a model directory's config.json (a `transformers` config's `to_dict()`)."""
        try:
            heads = int(config["num_attention_heads"])
            hidden = int(config["hidden_size"])
            return cls(
                hidden=hidden,
                layers=int(config["num_hidden_layers"]),
                heads=heads,
                kv_heads=int(config.get("num_key_value_heads") or heads),
                head_dim=int(config.get("head_dim") or hidden // heads),
                intermediate=int(config["intermediate_size"]),
                vocab=int(config["vocab_size"]),
                tied_embeddings=bool(config.get("tie_word_embeddings", False)),
                qk_norm=config.get("model_type") == "qwen3",
                qkv_bias=config.get("model_type") == "qwen2" or bool(config.get("attention_bias", False)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise InputError(f"the model config lacks {exc} or has a bad value; pass a decoder's config.json") from None

    @classmethod
    def from_config_file(cls, path: Path) -> ModelArch:
        path = Path(path)
        path = path / "config.json" if path.is_dir() else path
        try:
            return cls.from_hf_config(json.loads(path.read_text()))
        except (OSError, ValueError) as exc:
            raise InputError(f"cannot read a model config from {path} ({exc}); pass a config.json") from None

    @property
    def q_width(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_width(self) -> int:
        return self.kv_heads * self.head_dim

    def module_shapes(self) -> dict[str, tuple[int, int]]:
        """(in, out) features of each linear layer of one decoder layer."""
        h, q, k, i = self.hidden, self.q_width, self.kv_width, self.intermediate
        return {
            "q_proj": (h, q),
            "k_proj": (h, k),
            "v_proj": (h, k),
            "o_proj": (q, h),
            "gate_proj": (h, i),
            "up_proj": (h, i),
            "down_proj": (i, h),
        }

    def parameters(self) -> int:
        """Every parameter of the base model."""
        layer = sum(a * b for a, b in self.module_shapes().values()) + 2 * self.hidden
        layer += (self.q_width + 2 * self.kv_width) if self.qkv_bias else 0
        layer += 2 * self.head_dim if self.qk_norm else 0
        embeddings = self.vocab * self.hidden * (1 if self.tied_embeddings else 2)
        return embeddings + self.layers * layer + self.hidden

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        return 2 * self.layers * self.kv_width * dtype_bytes


def lora_parameters(arch: ModelArch, rank: int, targets: str | tuple[str, ...]) -> int:
    """LoRA's parameters: rank x (in + out) per targeted linear layer ("all-linear": every one but the output head)."""
    names = ALL_LINEAR if isinstance(targets, str) else tuple(targets)
    shapes = arch.module_shapes()
    unknown = sorted(set(names) - set(shapes))
    if unknown:
        raise InputError(f"LoRA target modules {unknown} are not linear layers of the model ({sorted(shapes)})")
    return arch.layers * sum(rank * (shapes[n][0] + shapes[n][1]) for n in names)


@dataclass(frozen=True)
class TaskPlan:
    """One task's estimate: named terms in bytes, their total, and the GPU memory it may use."""

    task: str
    terms: dict[str, int]
    budget: int
    notes: list[str] = field(default_factory=list)
    kv_tokens: int = 0  # the engine's: tokens its KV cache holds at once (0 for the trainer, or a cache too short)

    @property
    def total(self) -> int:
        return sum(self.terms.values())

    @property
    def fits(self) -> bool:
        return self.total <= self.budget

    def lines(self) -> list[str]:
        verdict = "fits" if self.fits else "DOES NOT FIT"
        out = [f"{self.task}: {self.total / GIB:.2f} GiB of {self.budget / GIB:.2f} GiB, {verdict}"]
        out += [f"  {name:<12} {value / GIB:9.3f} GiB" for name, value in self.terms.items()]
        return out + [f"  ({note})" for note in self.notes]


def _dtype_bytes(name: str) -> int:
    return {"float32": 4, "bfloat16": 2}[name]


def layer_activation_bytes(
    arch: ModelArch, *, dtype_bytes: int, attention: str, lora: tuple[str, ...], length: int
) -> int:
    """What autograd keeps for backward per token of one decoder layer (see the module docstring), in bytes."""
    h, q, k, i, d = arch.hidden, arch.q_width, arch.kv_width, arch.intermediate, dtype_bytes
    upcast = d != 4  # a float32 base keeps its own tensors where a bfloat16 one keeps float32 copies
    lora_inputs = arch.module_shapes()
    if upcast:
        kept = 2 * 4 * h  # the two RMSNorms' float32 inputs
        kept += sum(4 * lora_inputs[name][0] for name in lora)  # each LoRA input's float32 copy
        kept += 4 * (q + k) if arch.qk_norm else 0
    else:
        normed = {"q_proj", "k_proj", "v_proj"}, {"gate_proj", "up_proj"}
        kept = 2 * 4 * h + 4 * h * sum(1 for group in normed if group & set(lora))  # inputs, normed outputs
        kept += sum(4 * lora_inputs[name][0] for name in lora if name in ("o_proj", "down_proj"))
        kept += 4 * (q + k) if arch.qk_norm else 0
    kept += d * (2 * q + 2 * k)  # attention's q, k, v and output
    if attention == "eager":
        kept += arch.heads * length * (4 + d)  # the float32 softmax and the probabilities it is cast to
    else:
        kept += 4 * arch.heads  # sdpa's log-sum-exp
    kept += 3 * d * i  # the MLP's gate, up and silu(gate)
    return kept


def trainer_plan(
    arch: ModelArch,
    trainer: Any,
    *,
    prompt_tokens: int,
    completion_tokens: int,
    budget: int,
    samples: int | None = None,
    task: str = "trainer",
) -> TaskPlan:
    """The train step's memory on one rank for `trainer` (a `TrainerConfig`), per micro-batch. `samples`, the samples a
    step trains on, caps the micro-batch: a step of 32 samples never fills a micro-batch of 64."""
    d = _dtype_bytes(trainer.base_dtype)
    n_lora = lora_parameters(arch, trainer.lora_rank, trainer.target_modules)
    lora = ALL_LINEAR if isinstance(trainer.target_modules, str) else tuple(trainer.target_modules)
    batch = trainer.micro_batch_size if samples is None else max(1, min(trainer.micro_batch_size, samples))
    length = prompt_tokens + completion_tokens
    per_layer = layer_activation_bytes(arch, dtype_bytes=d, attention=trainer.attention, lora=lora, length=length)
    tokens = batch * length
    if trainer.gradient_checkpointing:  # each layer's input, and one layer recomputed at a time
        activations = tokens * (arch.layers * d * arch.hidden + per_layer)
    else:  # a layer's backward frees what it kept as fast as it allocates gradients: no extra layer at the peak
        activations = tokens * arch.layers * per_layer
    activations += tokens * 4 * arch.hidden  # the final norm's float32 input
    v, t = arch.vocab, batch * completion_tokens
    kept = d * tokens * v  # the output layer's [B, L, V]: the gather that picks the completion positions keeps it
    forward = d * t * v + (4 * t * v if d != 4 else 0) + 4 * t * v
    backward = 3 * 4 * t * v
    return TaskPlan(
        task=task,
        terms={
            "weights": arch.parameters() * d + n_lora * 4,
            "optimizer": n_lora * (4 + 8),
            "activations": activations,
            "logits": kept + max(forward, backward),
        },
        budget=budget,
        notes=[
            f"{trainer.base_dtype} base, {trainer.attention} attention, checkpointing "
            f"{'on' if trainer.gradient_checkpointing else 'off'}, {n_lora / 1e6:.1f} M LoRA parameters, micro-batches "
            f"of {batch} x {length} tokens"
        ],
    )


def engine_plan(arch: ModelArch, engine: Any, *, group_tokens: int, device: GpuSpec) -> TaskPlan:
    """vLLM's memory on one rollout GPU `device` for `engine` (an `EngineSpec`); `group_tokens` is one call's n x
    (prompt + completion), what the engine holds in KV cache to decode a whole group at once. An `engine.max_num_seqs`
    (rl.gpu_settings sizes it to one call's sequences) replaces vLLM's default."""
    budget = device.memory_bytes
    max_num_seqs, batched = vllm_batch_defaults(device)
    max_num_seqs = getattr(engine, "max_num_seqs", None) or max_num_seqs
    claimed = int(engine.gpu_memory_utilization * budget)
    lora_slots = 2 * 2 * lora_parameters(arch, engine.max_lora_rank, "all-linear")  # max_loras=2, bfloat16
    weights = arch.parameters() * 2 + lora_slots
    peak = batched * 2 * (4 * arch.intermediate + 2 * arch.hidden + arch.q_width + 2 * arch.kv_width)
    peak += 2 * 4 * max_num_seqs * arch.vocab  # the sampler's float32 logits and log-probs
    kv_cache = max(0, claimed - weights - peak - CUDA_CONTEXT_BYTES)
    tokens = kv_cache // arch.kv_bytes_per_token()
    max_len = engine.max_model_len or 0
    notes = [
        f"vLLM's batch on a {device.name}: {max_num_seqs} sequences, {batched:,} batched tokens",
        f"gpu_memory_utilization {engine.gpu_memory_utilization}: {claimed / GIB:.2f} GiB claimed; KV cache for "
        f"{tokens:,} tokens ({arch.kv_bytes_per_token() / 1024:.0f} KiB each), {tokens / max(group_tokens, 1):.1f} "
        f"groups of {group_tokens:,} at once",
    ]
    # vLLM claims its share whatever the need: the plan fits when the KV cache it leaves holds one full sequence.
    needed = max(max_len, 1) * arch.kv_bytes_per_token()
    terms = {"weights": weights, "activations": peak, "cuda_context": CUDA_CONTEXT_BYTES, "kv_cache": kv_cache}
    plan = TaskPlan(task="engine", terms=terms, budget=claimed, notes=notes, kv_tokens=tokens)
    if kv_cache < needed:
        notes.append(f"KV cache short of one {max_len}-token sequence ({needed / GIB:.2f} GiB): vLLM refuses to start")
        return TaskPlan(task="engine", terms={**terms, "kv_cache": needed}, budget=claimed, notes=notes)
    return plan
