"""`vllm.lora.request.LoRARequest` stand-in: the same positional fields and the same id check as vLLM's."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LoRARequest:
    """A LoRA adapter to apply: vLLM identifies (and caches) it by `lora_int_id`, which must be >= 1 (0 means none)."""

    lora_name: str
    lora_int_id: int
    lora_path: str = ""

    def __post_init__(self) -> None:
        if self.lora_int_id < 1:
            raise ValueError(f"id must be > 0, got {self.lora_int_id}")

    @property
    def path(self) -> str:
        return self.lora_path
