"""A request's temperature, top-p and top-k on real vLLM: what the engine records is the distribution sampled.

The session's engine runs `logprobs_mode="processed_logprobs"` (log_softmax after temperature and the top-k/top-p
mask: renormalised over the cut); a second engine here runs vLLM's default, `raw_logprobs`, on the same requests (one
more engine start, 20-80 s). Where vLLM's source says so, measured: at the defaults the two record the same bits, so
one mode serves every request; under settings, the same tokens are drawn and only processed log-probs are the
trainer's teacher-forced ones under those settings (raw ones are the untempered policy's: TRL #4159).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from gpu_helpers import summarize
from vllm_cpu_helpers import LOGPROB_MAX_ABS_TOL, generate, request

from rl.models.opened_model import open_model
from rl.types import Rollout, SamplingSettings

SETTINGS = {
    "temperature": SamplingSettings(temperature=0.6),
    "top_k": SamplingSettings(temperature=0.8, top_k=3),
    "top_p": SamplingSettings(temperature=1.2, top_p=0.7),
}


@pytest.fixture(scope="module")
def raw_engine(model_dir: Path, store: Any) -> Iterator[Any]:
    """A second `VLLMEngine` whose `LLM` records vLLM's default raw log-probs (started now, closed after)."""
    import rl.samplers.vllm as vllm_engine
    import rl.samplers.vllm_requests as vllm_requests
    from rl.gpu import vllm_cpu_llm_kwargs
    from rl.models import load_tokenizer

    engine = vllm_engine.VLLMEngine(
        open_model(model_dir), store, llm_kwargs=vllm_cpu_llm_kwargs(), tokenizer=load_tokenizer(open_model(model_dir))
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(vllm_requests, "VLLM_LOGPROBS_MODE", "raw_logprobs")
        assert engine.llm.llm_engine is not None  # started in raw mode
    yield engine
    engine.close()


def _gaps(rollouts: list[Rollout], policy: Any, sampling: SamplingSettings) -> list[float]:
    """|recorded - teacher-forced under `sampling`| for every token."""
    import torch

    from rl.samplers.decoding import teacher_forced_logprobs

    gaps: list[float] = []
    with torch.no_grad():
        for r in rollouts:
            forced = teacher_forced_logprobs(policy, r.prompt_token_ids, r.token_ids, sampling).double()
            gaps.extend((torch.tensor(r.logprobs, dtype=torch.float64) - forced).abs().tolist())
    return gaps


def test_at_the_defaults_processed_logprobs_are_raw_ones_bit_for_bit(
    engine: Any, raw_engine: Any, adapters: Any
) -> None:
    """Temperature 1.0 divides by one and no cut masks a token: the processed log-probs of 4 groups x 8 samples x up
    to 16 tokens are the raw ones, bitwise, and the tokens the same."""
    assert engine.llm.llm_engine.vllm_config.model_config.logprobs_mode == "processed_logprobs"
    assert raw_engine.llm.llm_engine.vllm_config.model_config.logprobs_mode == "raw_logprobs"
    reqs = [request(adapters["b"][0], seed=700 + g, prompt=g, group=g, max_tokens=16) for g in range(4)]
    processed, raw = generate(engine, *reqs), generate(raw_engine, *reqs)
    assert [[r.token_ids for r in g] for g in processed] == [[r.token_ids for r in g] for g in raw]
    assert [[r.logprobs for r in g] for g in processed] == [[r.logprobs for r in g] for g in raw]


@pytest.mark.parametrize("cut", sorted(SETTINGS))
def test_under_settings_processed_logprobs_are_the_trainers_and_raw_ones_are_not(
    engine: Any, raw_engine: Any, adapters: Any, policies: Any, cut: str, record_property: Any
) -> None:
    """The same tokens either way (the mode changes what is recorded, not what is drawn); processed log-probs equal
    the trainer's teacher-forced ones under the settings within `LOGPROB_MAX_ABS_TOL`; raw ones equal the untempered
    policy's, and differ from the settings' by far more."""
    sampling = SETTINGS[cut]
    reqs = [
        replace(request(adapters["b"][0], seed=800 + g, prompt=g, group=g, max_tokens=12), sampling=sampling)
        for g in range(3)
    ]
    processed = [r for g in generate(engine, *reqs) for r in g]
    raw = [r for g in generate(raw_engine, *reqs) for r in g]
    assert [r.token_ids for r in processed] == [r.token_ids for r in raw]
    policy = policies["b"]
    as_declared = summarize(_gaps(processed, policy, sampling))
    raw_vs_policy = summarize(_gaps(raw, policy, SamplingSettings()))
    raw_vs_declared = summarize(_gaps(raw, policy, sampling))
    line = "; ".join(
        f"{name}: mean |Δ| {g.mean:.1e}, max |Δ| {g.max:.1e} over {g.tokens} tokens"
        for name, g in (
            ("processed vs declared", as_declared),
            ("raw vs untempered", raw_vs_policy),
            ("raw vs declared", raw_vs_declared),
        )
    )
    record_property("sampling_gap", line)
    print(f"{cut} ({sampling}): {line}")
    assert as_declared.max <= LOGPROB_MAX_ABS_TOL, line
    assert raw_vs_policy.max <= LOGPROB_MAX_ABS_TOL, line
    assert raw_vs_declared.max > 100 * LOGPROB_MAX_ABS_TOL, line
