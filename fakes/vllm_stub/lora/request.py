"""`vllm.lora.request.LoRARequest` stand-in: the same fields, checks and equality as vLLM 0.33's."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, eq=False)
class LoRARequest:
    """A LoRA adapter to apply: vLLM caches it by `lora_int_id` (>= 1; 0 means none) and never reloads a cached id
    unless `load_inplace`; requests compare and hash by `lora_name` alone."""

    lora_name: str
    lora_int_id: int
    lora_path: str = ""
    base_model_name: str | None = None
    load_inplace: bool = False

    def __post_init__(self) -> None:
        if self.lora_int_id < 1:
            raise ValueError(f"id must be > 0, got {self.lora_int_id}")
        assert self.lora_path, "lora_path cannot be empty"  # vLLM asserts it too (an AssertionError)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LoRARequest) and self.lora_name == other.lora_name

    def __hash__(self) -> int:
        return hash(self.lora_name)

    @property
    def path(self) -> str:
        return self.lora_path
