"""What the vLLM engine sends vLLM and what it takes back: the `LLM` keywords, each group's `SamplingParams` (its
seed spaced by `VLLM_SEED_STRIDE`, settings vLLM cannot serve refused), the LoRA names, and each `RequestOutput`
translated into rollouts with its log-probs checked. No vLLM import: `rl.samplers.vllm.VLLMEngine` calls vLLM."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rl.errors import EngineOutputError, VLLMSamplingError
from rl.types import Rollout, RolloutRequest, SamplingSettings

if TYPE_CHECKING:
    from rl.models.opened_model import ModelDir

VLLM_SEED_STRIDE = 2**8
"""Each group seed owns this many consecutive vLLM seeds: the largest group whose per-sample seeds stay its own."""

# A generous bound: it catches a misaligned translation (log-probs shifted by a token), not float accumulation noise.
_CUMULATIVE_ATOL = 1e-2


def lora_name(version: int, digest: str) -> str:
    """vLLM's `lora_name` for an adapter: its policy version (for people), its digest (what tells adapters apart)."""
    if version < 0:
        raise ValueError(f"policy version must be >= 0, got {version}")
    return f"policy-v{version}-{digest.partition(':')[2][:12] or digest[:12]}"


VLLM_LOGPROBS_MODE = "processed_logprobs"
"""The `logprobs_mode` every engine's `LLM` is built with: one mode serves every request, whatever its settings."""

VLLM_MIN_TEMPERATURE = 1e-2
"""vLLM's `_MAX_TEMP` (0.32 and 0.33): `SamplingParams` raises a temperature in (0, 0.01) to 0.01 with only a log
warning, so vLLM would sample and record log-probs at 0.01 while the trainer teacher-forces the temperature asked for
(0 itself, below `_SAMPLING_EPS` 1e-5, is greedy decoding, which records untempered log-probs;
`SamplingSettings` refuses it already)."""
VLLM_MAX_TEMPERATURE = 2.0
"""vLLM's `SamplingParams` refuses a temperature above 2 (`VLLMValidationError`)."""


def check_vllm_sampling(sampling: SamplingSettings) -> None:
    """Refuse (`VLLMSamplingError`) settings vLLM cannot sample as `SamplingSettings` declares: a temperature below
    `VLLM_MIN_TEMPERATURE` (vLLM samples at 0.01 instead and records that distribution's log-probs: a silent wrong
    number) or above `VLLM_MAX_TEMPERATURE` (vLLM refuses it, after the engine started). top_p in (0, 1] and
    top_k >= 0 are vLLM's ranges too (top_k=0: no cut)."""
    t = sampling.temperature
    if t < VLLM_MIN_TEMPERATURE:
        raise VLLMSamplingError(
            f"temperature={t!r} is below {VLLM_MIN_TEMPERATURE}, which vLLM silently raises it to: it would sample "
            "and record log-probs at 0.01, not at the temperature the trainer teacher-forces; use a temperature >= "
            f"{VLLM_MIN_TEMPERATURE}, or the torch sampler (engine kind 'torch')"
        )
    if t > VLLM_MAX_TEMPERATURE:
        raise VLLMSamplingError(
            f"temperature={t!r} is above {VLLM_MAX_TEMPERATURE}, the most vLLM's SamplingParams accepts; use a "
            f"temperature <= {VLLM_MAX_TEMPERATURE}, or the torch sampler (engine kind 'torch')"
        )


ENGINE_FIXED_ARGS = ("model", "enable_lora", "logprobs_mode", "trust_remote_code")
"""`LLM` keywords the engine sets itself; `llm_kwargs` may not."""


def engine_llm_kwargs(base_model_dir: Path, llm_kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """Every keyword the engine passes to `vllm.LLM` (`nox -s vllm-api` checks them against `EngineArgs`)."""
    # trust_remote_code=False: vLLM never imports code a model directory names (its default, said explicitly).
    # processed_logprobs: the log-probs of the distribution sampled (after temperature and top-k/top-p, renormalised);
    # raw_logprobs, vLLM's default, would record the untempered, uncut policy's (TRL #4159).
    fixed = {"model": str(base_model_dir), "enable_lora": True, "logprobs_mode": VLLM_LOGPROBS_MODE}
    return {**fixed, "trust_remote_code": False, **llm_kwargs}


def model_max_len(base_model_dir: ModelDir) -> int:
    """The longest sequence the opened model `base_model_dir` supports (`max_position_embeddings` of its config.json
    as its door read it): vLLM's default `max_model_len`, and the most it accepts."""
    from rl.models.opened_model import checked_model

    return int(checked_model(base_model_dir).json("config.json")["max_position_embeddings"])


def vllm_seed(seed: int) -> int:
    """The seed vLLM gets for a group seeded `seed`: completion i then samples with `seed * VLLM_SEED_STRIDE + i`, a
    range no other group seed's range meets."""
    return seed * VLLM_SEED_STRIDE


def sampling_params_kwargs(request: RolloutRequest) -> dict[str, Any]:
    """The `SamplingParams` keyword arguments for one group, as the tutorial writes them, at the request's sampling
    settings (`check_vllm_sampling` refuses those vLLM cannot serve), with the group's seed spaced apart
    (`vllm_seed`)."""
    check_vllm_sampling(request.sampling)
    if request.n > VLLM_SEED_STRIDE:
        raise ValueError(
            f"group {request.group_id} asks for n={request.n} completions; the vLLM engine spaces group seeds "
            f"{VLLM_SEED_STRIDE} apart (vLLM seeds completion i with seed + i), so groups of more than "
            f"{VLLM_SEED_STRIDE} would share samples: use a smaller group or raise VLLM_SEED_STRIDE"
        )
    return {
        "n": request.n,
        "temperature": float(request.sampling.temperature),
        "top_p": float(request.sampling.top_p),
        "top_k": int(request.sampling.top_k),  # 0: no cut (vLLM 0.32 and 0.33 spell it 0; -1 is their old spelling)
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
