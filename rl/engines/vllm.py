"""The rollout engine on vLLM, exactly as the rollouts tutorial samples: one group per call, LoRA per version.

    LLM(model=<base dir>, enable_lora=True, logprobs_mode="raw_logprobs")
    LoRARequest(f"policy-v{version}-{digest[:12]}", <one id per adapter digest, from 1>, <adapter dir>)
    SamplingParams(n=G, temperature=1.0, top_p=1.0, seed=<seed> * 256, logprobs=0, max_tokens=<max_tokens>)

`logprobs=0` makes vLLM return only the sampled token's log-probability at each position, which is what the trainer's
importance ratio needs. vLLM 0.33 reports *raw* log-probs (the model's, before temperature and top-p) unless told
otherwise; the engine asks for that explicitly (`LLM(logprobs_mode="raw_logprobs")`, so a changed default cannot
move it), and samples at temperature 1.0 and top_p 1.0, where the raw distribution is also the one sampled from: the
recorded log-prob is then the policy's own, as the loss assumes. LoRA ids start at 1 because vLLM reserves 0 for
"no adapter".

vLLM caches a LoRA by its integer id and never reloads a known id (unless `load_inplace=True`), and it tells requests
apart by `lora_name`. The tutorial's `id = version + 1` therefore breaks on an engine that outlives a run (the process
cache in `rl.flyte.grpo_tasks`, a `ReusePolicy` replica): a second run's version 0 is another adapter under run
one's id 1, and vLLM would sample the stale one. So the engine gives each distinct adapter *digest* its own id (1, 2,
... in the order it first sees them, for the engine's life) and puts the digest in the name; the version stays in the
name for people reading vLLM's logs.

vLLM samples completion i of a request alone, seeded `seed + i` (`vllm/v1/engine/parallel_sampling.py`). Passing the
group's seed as it is would make groups seeded s and s + 1 (same prompt, same adapter) share n - 1 completions, so the
engine passes `vllm_seed(seed) = seed * VLLM_SEED_STRIDE`: distinct group seeds then own disjoint ranges of per-sample
seeds (for n <= VLLM_SEED_STRIDE; larger groups are refused). vLLM's seeds are 64-bit (torch generators, int64 seed
arrays), so the product fits. The rollouts still carry the group's own seed.

Prompts go to vLLM as text, as in the tutorial, unless the engine is given the model's own `tokenizer`: then they go as
token ids (`{"prompt_token_ids": [...]}`) and completions are decoded with it. The tiny character model needs that:
transformers 5's `AutoTokenizer`, which vLLM loads, builds a `Qwen2Tokenizer` for any model_type qwen2, and that one
drops spaces and newlines.

`vllm` is imported on first use, never at import time (it cannot be installed on CPU machines). Tests inject
`fakes.vllm_stub`, a stand-in with vLLM's public names and output shapes, through `vllm_module=`. This module imports
no torch.
"""

from __future__ import annotations

import importlib
import json
import math
import shutil
import tempfile
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from rl.artifacts import materialize
from rl.protocols import Artifacts
from rl.types import ArtifactRef, Rollout, RolloutRequest

VLLM_SEED_STRIDE = 2**8
VLLM_MAX_LORA_RANKS: tuple[int, ...] = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""vLLM 0.33's `vllm.config.lora.MaxLoRARanks`: the only values `max_lora_rank` may take (vLLM's config refuses any
other; `nox -s vllm-api` checks this against the wheel). An adapter of rank r is served by any `max_lora_rank >= r`."""
"""Each group seed owns this many consecutive vLLM seeds: the largest group whose per-sample seeds stay its own."""

# A generous bound: it catches a misaligned translation (log-probs shifted by a token), not float accumulation noise.
_CUMULATIVE_ATOL = 1e-2


class VLLMUnavailable(ImportError):
    """vLLM is not installed in this environment."""


class EngineOutputError(RuntimeError):
    """vLLM's output lacks or contradicts what the engine asked for (log-probs, one output per prompt, ...)."""


def import_vllm() -> ModuleType:
    """The real `vllm` module, imported now; raises `VLLMUnavailable` with what to do if it is missing."""
    try:
        return importlib.import_module("vllm")
    except ImportError as e:
        raise VLLMUnavailable(
            "vllm is not installed: install the GPU extra (`pip install .[gpu]`, or `nox -s gpu`) on a CUDA machine, "
            "or use rl.engines.torch_sampler.TorchSampler on CPU"
        ) from e


def lora_name(version: int, digest: str) -> str:
    """vLLM's `lora_name` for an adapter: its policy version (for people), its digest (what tells adapters apart)."""
    if version < 0:
        raise ValueError(f"policy version must be >= 0, got {version}")
    return f"policy-v{version}-{digest.partition(':')[2][:12] or digest[:12]}"


ENGINE_FIXED_ARGS = ("model", "enable_lora", "logprobs_mode")
"""`LLM` keywords the engine sets itself; `llm_kwargs` may not."""


def engine_llm_kwargs(base_model_dir: Path, llm_kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """Every keyword the engine passes to `vllm.LLM` (`nox -s vllm-api` checks them against `EngineArgs`)."""
    return {"model": str(base_model_dir), "enable_lora": True, "logprobs_mode": "raw_logprobs", **llm_kwargs}


def model_max_len(base_model_dir: Path) -> int:
    """The longest sequence the model in `base_model_dir` supports (`max_position_embeddings` of its config.json):
    vLLM's default `max_model_len`, and the most it accepts."""
    config = json.loads((Path(base_model_dir) / "config.json").read_text())
    return int(config["max_position_embeddings"])


def vllm_seed(seed: int) -> int:
    """The seed vLLM gets for a group seeded `seed`: completion i then samples with `seed * VLLM_SEED_STRIDE + i`, a
    range no other group seed's range meets."""
    return seed * VLLM_SEED_STRIDE


def sampling_params_kwargs(request: RolloutRequest) -> dict[str, Any]:
    """The `SamplingParams` keyword arguments for one group, as the tutorial writes them, with the group's seed
    spaced apart (`vllm_seed`)."""
    if request.n > VLLM_SEED_STRIDE:
        raise ValueError(
            f"group {request.group_id} asks for n={request.n} completions; the vLLM engine spaces group seeds "
            f"{VLLM_SEED_STRIDE} apart (vLLM seeds completion i with seed + i), so groups of more than "
            f"{VLLM_SEED_STRIDE} would share samples: use a smaller group or raise VLLM_SEED_STRIDE"
        )
    return {
        "n": request.n,
        "temperature": 1.0,
        "top_p": 1.0,
        "seed": vllm_seed(request.seed),
        "logprobs": 0,
        "max_tokens": request.max_tokens,
    }


def _sampled_logprobs(completion: Any, where: str) -> list[float]:
    token_ids = list(completion.token_ids)
    per_position = completion.logprobs
    if per_position is None:
        raise EngineOutputError(f"{where}: no log-probs came back; SamplingParams(logprobs=0) was not honoured")
    if len(per_position) != len(token_ids):
        raise EngineOutputError(
            f"{where}: {len(per_position)} log-prob entries for {len(token_ids)} tokens; they must align one to one"
        )
    out: list[float] = []
    for t, (token, candidates) in enumerate(zip(token_ids, per_position, strict=True)):
        entry = candidates.get(token) if candidates is not None else None
        if entry is None:
            raise EngineOutputError(
                f"{where}: position {t} has no log-prob for its sampled token {token} (has {sorted(candidates or {})})"
            )
        value = float(entry.logprob)
        if not (value <= 0.0 and math.isfinite(value)):
            raise EngineOutputError(f"{where}: position {t} has log-prob {value}; a log-probability is finite and <= 0")
        out.append(value)
    cumulative = getattr(completion, "cumulative_logprob", None)
    if cumulative is not None and abs(float(cumulative) - math.fsum(out)) > _CUMULATIVE_ATOL:
        raise EngineOutputError(
            f"{where}: cumulative_logprob {cumulative} disagrees with the sum of per-token log-probs {math.fsum(out)}"
        )
    return out


def rollouts_from_request_output(
    output: Any,
    request: RolloutRequest,
    *,
    decode: Callable[[list[int]], str] | None = None,
    expected_prompt_ids: list[int] | None = None,
) -> list[Rollout]:
    """Translate one vLLM `RequestOutput` (one prompt, `request.n` completions) into rollouts, in completion order.

    Each `CompletionOutput` gives `token_ids` (the sampled ids, `<eos>` included when it stopped there), `text`
    (detokenized, special tokens skipped) and `logprobs` (per position, a dict token id -> `Logprob`; with
    `logprobs=0` it holds the sampled token). `decode`, when given, replaces vLLM's `text` (see the module docstring);
    `expected_prompt_ids`, when given, must equal the prompt ids vLLM reports.
    """
    where = f"group {request.group_id} (policy v{request.policy_version}, seed {request.seed})"
    completions = sorted(output.outputs, key=lambda c: c.index)
    if len(completions) != request.n:
        raise EngineOutputError(f"{where}: asked for n={request.n} completions, got {len(completions)}")
    if output.prompt_token_ids is None:
        raise EngineOutputError(f"{where}: the output carries no prompt_token_ids; the trainer needs them")
    prompt_ids = [int(t) for t in output.prompt_token_ids]
    if expected_prompt_ids is not None and prompt_ids != list(expected_prompt_ids):
        raise EngineOutputError(f"{where}: vLLM reports prompt ids {prompt_ids}, the engine sent {expected_prompt_ids}")
    return [
        Rollout(
            group_id=request.group_id,
            question=request.prompt.question,
            answer=request.prompt.answer,
            completion=decode([int(t) for t in c.token_ids]) if decode is not None else str(c.text),
            prompt_token_ids=list(prompt_ids),
            token_ids=[int(t) for t in c.token_ids],
            logprobs=_sampled_logprobs(c, f"{where}, completion {c.index}"),
            policy_version=request.policy_version,
            seed=request.seed,
        )
        for c in completions
    ]


class VLLMEngine:
    """`RolloutEngine` on vLLM: one `LLM` per engine (created on first use), one LoRA adapter per policy version.

    Pass `tokenizer=rl.models.load_tokenizer(base_model_dir)` for the tiny character model (see the module docstring).

    Adapters are fetched from `artifacts` by digest and written once each under `adapter_root` (a private temporary
    directory unless given), because vLLM loads a LoRA from a directory path.
    """

    def __init__(
        self,
        base_model_dir: Path,
        artifacts: Artifacts,
        *,
        vllm_module: ModuleType | None = None,
        adapter_root: Path | None = None,
        llm_kwargs: Mapping[str, Any] | None = None,
        tokenizer: Any | None = None,
    ) -> None:
        self.base_model_dir = Path(base_model_dir)
        self.artifacts = artifacts
        self._vllm = vllm_module
        self._lora_request_cls: Any = None
        self.llm_kwargs = dict(llm_kwargs or {})
        for reserved in ENGINE_FIXED_ARGS:
            if reserved in self.llm_kwargs:
                raise ValueError(
                    f"llm_kwargs may not set {reserved!r}; the engine passes it itself (the loss needs it as it is)"
                )
        # A directory the engine made itself goes when the engine does (garbage collected or at exit): a warm
        # replica serves many runs, and each engine's adapter copies would otherwise pile up in /tmp.
        self._own_root = None if adapter_root else tempfile.TemporaryDirectory(prefix="rl-vllm-")
        self.adapter_root = Path(adapter_root or self._own_root.name)  # type: ignore[union-attr]
        self.adapter_root.mkdir(parents=True, exist_ok=True)
        self._llm: Any = None
        self._lora_by_digest: dict[str, tuple[str, int]] = {}  # digest -> (lora_name, lora_int_id), never reassigned
        self._adapter_dirs: dict[str, Path] = {}
        self.tokenizer = tokenizer

    @property
    def vllm(self) -> ModuleType:
        if self._vllm is None:
            self._vllm = import_vllm()
        return self._vllm

    @property
    def llm(self) -> Any:
        """The `vllm.LLM`, created on first access: `LLM(**engine_llm_kwargs(base dir, llm_kwargs))`."""
        if self._llm is None:
            self._llm = self.vllm.LLM(**engine_llm_kwargs(self.base_model_dir, self.llm_kwargs))
        return self._llm

    def lora_id(self, version: int, digest: str) -> tuple[str, int]:
        """(lora_name, lora_int_id) of an adapter: assigned on first sight, before vLLM sees it, and kept for good, so
        one id never names two adapters, whichever call failed in between."""
        known = self._lora_by_digest.get(digest)
        if known is None:
            known = self._lora_by_digest[digest] = (lora_name(version, digest), len(self._lora_by_digest) + 1)
        return known

    def _lora_request(self, version: int, digest: str, adapter_dir: Path) -> Any:
        if self._lora_request_cls is None:
            # Import the submodule by name so it works for the real package and for an injected stand-in alike.
            self._lora_request_cls = importlib.import_module(f"{self.vllm.__name__}.lora.request").LoRARequest
        name, lora_int_id = self.lora_id(version, digest)
        return self._lora_request_cls(name, lora_int_id, str(adapter_dir))

    async def _adapter_dir(self, adapter: ArtifactRef) -> Path:
        cached = self._adapter_dirs.get(adapter.digest)
        if cached is not None:
            return cached
        final = self.adapter_root / adapter.digest.replace(":", "-")
        if not final.is_dir():
            staging = self.adapter_root / f".staging-{uuid.uuid4().hex}"
            await materialize(self.artifacts, adapter, staging)
            try:
                staging.rename(final)
            except OSError:
                shutil.rmtree(staging, ignore_errors=True)
                if not final.is_dir():
                    raise
        self._adapter_dirs[adapter.digest] = final
        return final

    async def generate(self, request: RolloutRequest) -> list[Rollout]:
        adapter_dir = await self._adapter_dir(request.adapter)
        lora = self._lora_request(request.policy_version, request.adapter.digest, adapter_dir)
        sampling = self.vllm.SamplingParams(**sampling_params_kwargs(request))
        prompt: Any = request.prompt.question
        prompt_ids: list[int] | None = None
        decode: Callable[[list[int]], str] | None = None
        if self.tokenizer is not None:
            prompt_ids = [int(t) for t in self.tokenizer(request.prompt.question)["input_ids"]]
            prompt = {"prompt_token_ids": prompt_ids}
            decode = self._decode
        outputs = self.llm.generate([prompt], sampling, lora_request=lora)
        if len(outputs) != 1:
            raise EngineOutputError(f"asked vLLM for one prompt's group, got {len(outputs)} request outputs")
        return rollouts_from_request_output(outputs[0], request, decode=decode, expected_prompt_ids=prompt_ids)

    def close(self) -> None:
        """Stop vLLM's engine process and free its GPU memory; the next `generate` starts a fresh `LLM`.

        vLLM 0.33's `LLMEngine` has no `shutdown`: its engine-core client (`llm_engine.engine_core`) has. Without
        this, the engine core outlives the engine until the interpreter exits, holding its share of the GPU.
        """
        llm, self._llm = self._llm, None
        if llm is None:
            return
        core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
        shutdown = getattr(core, "shutdown", None)
        if not callable(shutdown):
            raise EngineOutputError(
                "this vllm's LLM has no llm_engine.engine_core.shutdown() (vLLM 0.33's way to stop the engine "
                "process); pin vllm to the tested range of pyproject.toml's gpu extra"
            )
        shutdown()

    def _decode(self, token_ids: list[int]) -> str:
        assert self.tokenizer is not None
        return str(self.tokenizer.decode(token_ids, skip_special_tokens=True))
