"""The trainer's hyper-parameters: one frozen value, checked at construction so a bad setting fails before any step."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal, get_args

from pydantic import model_validator

from rl.algorithm.advantages import Scale
from rl.errors import InputError

if TYPE_CHECKING:
    import torch

ADVANTAGE_SCALES: tuple[str, ...] = get_args(Scale)
BaseDtype = Literal["float32", "bfloat16"]
BASE_DTYPES: tuple[str, ...] = get_args(BaseDtype)
Attention = Literal["eager", "sdpa"]
ATTENTION_KERNELS: tuple[str, ...] = get_args(Attention)


@dataclass(frozen=True)
class TrainerConfig:
    """LoRA shape, AdamW settings, the GRPO loss's constants and the determinism knobs of one trainer.

    The defaults learn the tiny-model digit task (lr 1e-2, LoRA on every linear layer; the demo takes lr 5e-3 with
    groups of 16, which learns it on every seed: docs/benchmarks.md); the
    loss constants match the tutorial (`clip_eps=0.2`, `kl_beta=0.03`). `max_grad_norm=math.inf` disables clipping but
    the norm is still reported. `threads` pins torch's intra-op thread count for the step, because the thread count
    changes the bits of a reduction and a replayed step must be bitwise identical.
    """

    # Validated from JSON (a Flyte `--config`) through pydantic: a key that is not a field is refused, not dropped.
    __pydantic_config__: ClassVar[dict[str, str]] = {"extra": "forbid"}

    lora_rank: int = 8
    lora_alpha: int = 16
    lora_dropout: float = 0.0
    # PEFT's "all-linear" wraps every linear layer except the output head; a tuple names modules explicitly.
    target_modules: str | tuple[str, ...] = "all-linear"
    lr: float = 1e-2
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    adam_eps: float = 1e-8
    max_grad_norm: float = 1.0
    clip_eps: float = 0.2
    clip_eps_high: float | None = None
    kl_beta: float = 0.03
    advantage_scale: Scale = "population_std"
    std_eps: float = 1e-4
    max_staleness: int = 1
    seed: int = 0
    threads: int = 1
    # Samples per padded forward of the loss (`rl.trainer.batched_loss`); a DDP rank runs its shard the same way.
    micro_batch_size: int = 64
    # The batched path forwards each distinct prompt of a micro-batch once and its samples' completions on that KV
    # cache (from 10 M parameters, with no dropout; never with gradient checkpointing, which refuses a KV cache). Off:
    # every sample's prompt is forwarded. The two agree up to float rounding.
    share_prompts: bool = True
    # How the frozen base model is held (`rl.models.load_base_model`). The LoRA weights, their gradients and the
    # optimizer state are float32 whatever the base (PEFT upcasts the adapter). The defaults are the CPU demo's (its
    # recorded numbers come from them); a real-size model trains with "bfloat16", "sdpa" and checkpointing
    # (`rl.deploy.flyte.config.stress`; `rl plan` prints what each costs).
    base_dtype: BaseDtype = "float32"
    attention: Attention = "eager"
    # Recompute each decoder layer's activations in backward instead of keeping them: a layer's input per token is all
    # that stays, for one more forward's compute.
    gradient_checkpointing: bool = False

    # Settings earlier versions had, each with what to do now: from JSON they are refused by name with that advice.
    RETIRED: ClassVar[dict[str, str]] = {
        "loss_path": 'the trainer has one loss path, the batched one ("batched", the old default); delete the key',
    }

    @model_validator(mode="before")
    @classmethod
    def _refuse_retired(cls, data: Any) -> Any:
        """Pydantic runs this on JSON input before the fields; a Python call refuses an unknown keyword itself."""
        for key in sorted(cls.RETIRED.keys() & data.keys()) if isinstance(data, dict) else ():
            raise InputError(f"{key} is no longer a trainer setting: {cls.RETIRED[key]}")
        return data

    def __post_init__(self) -> None:
        if not isinstance(self.lora_rank, int) or self.lora_rank < 1:
            raise InputError(f"lora_rank must be a positive int, got {self.lora_rank!r}")
        if not isinstance(self.lora_alpha, int) or self.lora_alpha < 1:
            raise InputError(f"lora_alpha must be a positive int (PEFT's type), got {self.lora_alpha!r}")
        if not 0.0 <= self.lora_dropout < 1.0:
            raise InputError(f"lora_dropout must be in [0, 1), got {self.lora_dropout!r}")
        if isinstance(self.target_modules, str):
            if self.target_modules != "all-linear":  # PEFT matches any other string as a regular expression
                raise InputError(
                    f'target_modules must be "all-linear" or a non-empty tuple of module names, got '
                    f"{self.target_modules!r}"
                )
        elif not self.target_modules or not all(isinstance(m, str) and m for m in self.target_modules):
            raise InputError(
                f'target_modules must be "all-linear" or a non-empty tuple of module names, got {self.target_modules!r}'
            )
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise InputError(f"lr must be a finite number > 0, got {self.lr!r}")
        if not (math.isfinite(self.weight_decay) and self.weight_decay >= 0):
            raise InputError(f"weight_decay must be a finite number >= 0, got {self.weight_decay!r}")
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            raise InputError(f"betas must be two numbers in [0, 1), got {self.betas!r}")
        if not self.adam_eps > 0:
            raise InputError(f"adam_eps must be > 0, got {self.adam_eps!r}")
        if not self.max_grad_norm > 0:
            raise InputError(f"max_grad_norm must be > 0 (math.inf disables clipping), got {self.max_grad_norm!r}")
        if not 0.0 < self.clip_eps < 1.0:
            raise InputError(f"clip_eps must be in (0, 1), got {self.clip_eps!r}")
        if self.clip_eps_high is not None and not self.clip_eps_high > 0:
            raise InputError(f"clip_eps_high must be > 0 or None (then clip_eps is used), got {self.clip_eps_high!r}")
        if not (math.isfinite(self.kl_beta) and self.kl_beta >= 0):
            raise InputError(f"kl_beta must be a finite number >= 0, got {self.kl_beta!r}")
        if self.advantage_scale not in ADVANTAGE_SCALES:
            raise InputError(f"advantage_scale must be one of {ADVANTAGE_SCALES}, got {self.advantage_scale!r}")
        if not self.std_eps > 0:
            raise InputError(f"std_eps must be > 0, got {self.std_eps!r}")
        if not isinstance(self.max_staleness, int) or self.max_staleness < 0:
            raise InputError(f"max_staleness must be an int >= 0 (0: strictly on-policy), got {self.max_staleness!r}")
        if not isinstance(self.seed, int) or self.seed < 0:
            raise InputError(f"seed must be an int >= 0, got {self.seed!r}")
        if not isinstance(self.micro_batch_size, int) or self.micro_batch_size < 1:
            raise InputError(
                f"micro_batch_size must be an int >= 1 (samples per batched forward), got {self.micro_batch_size!r}"
            )
        if self.base_dtype not in BASE_DTYPES:
            raise InputError(f"base_dtype must be one of {BASE_DTYPES}, got {self.base_dtype!r}")
        if self.attention not in ATTENTION_KERNELS:
            raise InputError(f"attention must be one of {ATTENTION_KERNELS}, got {self.attention!r}")
        if not isinstance(self.gradient_checkpointing, bool):
            raise InputError(f"gradient_checkpointing must be true or false, got {self.gradient_checkpointing!r}")
        if not isinstance(self.threads, int) or self.threads < 1:
            raise InputError(f"threads must be an int >= 1, got {self.threads!r}")


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype a `TrainerConfig.base_dtype` names (torch imported here: this module stays light)."""
    import torch

    return {"float32": torch.float32, "bfloat16": torch.bfloat16}[name]
