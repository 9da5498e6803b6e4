"""A stand-in for the `vllm` package: its public names and output shapes, sampling with the torch sampler on CPU.

vLLM cannot be installed on CPU machines, so `rl.engines.vllm.VLLMEngine(..., vllm_module=fakes.vllm_stub)` runs its
translation code against this module in the unit tests. What it reproduces of vLLM:

- `LLM(model=..., enable_lora=...)`; `LLM.generate(prompts, sampling_params, lora_request=...)` returns
  `list[RequestOutput]`, one per prompt, each with `prompt_token_ids` and `outputs: list[CompletionOutput]`
  (`index`, `text`, `token_ids`, `cumulative_logprob`, `logprobs`, `finish_reason`).
- `logprobs=0` gives, per position, `{sampled_token_id: Logprob(logprob=...)}`; `logprobs=None` gives `None` (and no
  `cumulative_logprob`). `<eos>` stays in `token_ids` and out of `text`.
- LoRA adapters are merged into a base copy, as `TorchSampler` does by default, so the two engines sample alike.
- LoRA adapters are cached by `lora_int_id`, like vLLM: a second adapter under a known id is *not* loaded (the stale
  adapter is served). A `LoRARequest` without `enable_lora=True` and an adapter rank above `max_lora_rank` are errors.
- A prompt is text or a `TokensPrompt` dict `{"prompt_token_ids": [...]}` (then `RequestOutput.prompt` is None).
- Seeds as vLLM 0.33 uses them (`vllm/v1/engine/parallel_sampling.py`): a request with `n` completions is `n` child
  requests, child `i` sampled alone with seed `seed + i`; so completion `i` of a request seeded `s` is completion 0 of
  one seeded `s + i`. `seed=None` samples from fresh entropy.

What it does not do raises rather than silently differing: temperature or top_p other than 1.0 and `logprobs` > 0
(`NotImplementedError`), any other sampling field such as stop strings (`TypeError`). Prompts of one call run one after
another, not batched, and sampled bits need not match a GPU's. Every call is recorded (`LLM.init_kwargs`,
`LLM.generate_calls`) so tests can assert what an adapter passed.
"""

from __future__ import annotations

import json
import math
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fakes.vllm_stub.lora.request import LoRARequest

__all__ = ["LLM", "CompletionOutput", "GenerateCall", "LoRARequest", "Logprob", "RequestOutput", "SamplingParams"]


@dataclass
class Logprob:
    """`vllm.sequence.Logprob`: one token's log-probability, rank and text (the stub leaves rank unset)."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class CompletionOutput:
    """`vllm.outputs.CompletionOutput`: one of the `n` completions of a prompt."""

    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: list[dict[int, Logprob]] | None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


@dataclass
class RequestOutput:
    """`vllm.outputs.RequestOutput`: everything generated for one prompt."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int] | None
    prompt_logprobs: None
    outputs: list[CompletionOutput]
    finished: bool = True


_SUPPORTED_SAMPLING = ("n", "temperature", "top_p", "seed", "logprobs", "max_tokens")


class SamplingParams:
    """`vllm.SamplingParams`, restricted to the fields the rollout engine uses; any other field is a `TypeError`."""

    def __init__(
        self,
        *,
        n: int = 1,
        temperature: float = 1.0,
        top_p: float = 1.0,
        seed: int | None = None,
        logprobs: int | None = None,
        max_tokens: int | None = 16,
        **unsupported: Any,
    ) -> None:
        if unsupported:
            raise TypeError(
                f"the vLLM stub's SamplingParams supports only {', '.join(_SUPPORTED_SAMPLING)}; "
                f"got {sorted(unsupported)}"
            )
        if n < 1:
            raise ValueError(f"n must be at least 1, got {n}.")
        if max_tokens is not None and max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {max_tokens}.")
        if logprobs is not None and logprobs < 0:
            raise ValueError(f"logprobs must be non-negative, got {logprobs}.")
        self.n, self.temperature, self.top_p, self.seed = n, temperature, top_p, seed
        self.logprobs, self.max_tokens = logprobs, max_tokens

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={getattr(self, k)!r}" for k in _SUPPORTED_SAMPLING)
        return f"SamplingParams({fields})"


def _child_seeds(sp: SamplingParams) -> list[int]:
    """vLLM's per-completion seeds: `seed + i` for completion i, or fresh entropy for each when `seed` is None."""
    if sp.seed is None:
        return [secrets.randbits(31) for _ in range(sp.n)]
    return [sp.seed + i for i in range(sp.n)]


@dataclass
class GenerateCall:
    """One recorded `LLM.generate` call."""

    prompts: list[str | dict[str, Any]]
    sampling_params: list[SamplingParams]
    lora_request: LoRARequest | None


@dataclass
class _Loaded:
    lora_request: LoRARequest
    model: Any


class LLM:
    """`vllm.LLM` on the torch sampler: loads the base model directory `model` (and LoRA adapters by id)."""

    def __init__(
        self, model: str, *, enable_lora: bool = False, max_lora_rank: int = 16, max_loras: int = 1, **kwargs: Any
    ) -> None:
        from rl.engines.torch_sampler import AdapterCache
        from rl.models import load_tokenizer

        self.init_kwargs: dict[str, Any] = {
            "model": model,
            "enable_lora": enable_lora,
            "max_lora_rank": max_lora_rank,
            "max_loras": max_loras,
            **kwargs,
        }
        self.generate_calls: list[GenerateCall] = []
        self.enable_lora = enable_lora
        self.max_lora_rank = max_lora_rank
        self.tokenizer = load_tokenizer(Path(model))
        # vLLM keeps many more LoRAs on the CPU than it runs at once; the stub never evicts.
        self._cache = AdapterCache(Path(model), capacity=1 << 16, merge=True)
        self._loras: dict[int, _Loaded] = {}
        self._requests = 0
        self.lora_loads = 0

    def _model_for(self, lora: LoRARequest | None) -> Any:
        if lora is None:
            return self._cache.base
        if not self.enable_lora:
            raise ValueError(
                f"LoRA request {lora.lora_name!r} was given but LoRA is not enabled; pass enable_lora=True"
            )
        loaded = self._loras.get(lora.lora_int_id)
        if loaded is None:
            config_path = Path(lora.lora_path) / "adapter_config.json"
            rank = int(json.loads(config_path.read_text()).get("r", 0)) if config_path.is_file() else 0
            if rank > self.max_lora_rank:
                raise ValueError(f"LoRA rank {rank} is greater than max_lora_rank {self.max_lora_rank}.")
            loaded = _Loaded(lora, self._cache.load_dir(str(lora.lora_int_id), Path(lora.lora_path)))
            self._loras[lora.lora_int_id] = loaded
            self.lora_loads += 1
        return loaded.model

    def generate(
        self,
        prompts: str | dict[str, Any] | list[str | dict[str, Any]],
        sampling_params: SamplingParams | list[SamplingParams] | None = None,
        *,
        lora_request: LoRARequest | None = None,
        use_tqdm: bool = True,
    ) -> list[RequestOutput]:
        from rl.engines.torch_sampler import sample_group

        prompt_list = [prompts] if isinstance(prompts, str | dict) else list(prompts)
        if sampling_params is None:
            sampling_params = SamplingParams()
        params = list(sampling_params) if isinstance(sampling_params, list) else [sampling_params] * len(prompt_list)
        if len(params) != len(prompt_list):
            raise ValueError("The lengths of prompts and sampling_params must be the same.")
        self.generate_calls.append(GenerateCall(prompt_list, params, lora_request))
        model = self._model_for(lora_request)
        eos = int(self.tokenizer.eos_token_id)
        results = []
        for prompt, sp in zip(prompt_list, params, strict=True):
            if sp.temperature != 1.0 or sp.top_p != 1.0:
                raise NotImplementedError("the vLLM stub samples at temperature 1.0 and top_p 1.0 only")
            if sp.logprobs not in (None, 0):
                raise NotImplementedError("the vLLM stub returns only the sampled token's log-prob (logprobs=0)")
            if isinstance(prompt, dict):  # a TokensPrompt: vLLM skips tokenization and reports no prompt text
                prompt_ids, prompt_text = [int(t) for t in prompt["prompt_token_ids"]], None
            else:
                prompt_ids, prompt_text = [int(t) for t in self.tokenizer(prompt)["input_ids"]], prompt
            max_tokens = sp.max_tokens if sp.max_tokens is not None else 16
            seqs = [
                sample_group(model, prompt_ids, n=1, max_tokens=max_tokens, seed=child_seed, eos_token_id=eos)[0]
                for child_seed in _child_seeds(sp)
            ]
            outputs = []
            for i, s in enumerate(seqs):
                text = self.tokenizer.decode(s.token_ids, skip_special_tokens=True)
                with_logprobs = sp.logprobs is not None
                outputs.append(
                    CompletionOutput(
                        index=i,
                        text=str(text),
                        token_ids=list(s.token_ids),
                        cumulative_logprob=math.fsum(s.logprobs) if with_logprobs else None,
                        logprobs=(
                            [
                                {t: Logprob(logprob=lp, decoded_token=str(self.tokenizer.decode([t])))}
                                for t, lp in zip(s.token_ids, s.logprobs, strict=True)
                            ]
                            if with_logprobs
                            else None
                        ),
                        finish_reason="stop" if s.stopped_at_eos else "length",
                    )
                )
            results.append(
                RequestOutput(
                    request_id=str(self._requests),
                    prompt=prompt_text,
                    prompt_token_ids=prompt_ids,
                    prompt_logprobs=None,
                    outputs=outputs,
                )
            )
            self._requests += 1
        return results
