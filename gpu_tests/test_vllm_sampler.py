"""The vLLM rollout engine on a GPU (`rl.samplers.vllm.VLLMEngine` over real vLLM, bf16, LoRA per policy version).

Served adapters are identified by what they compute, never by their names: vLLM caches LoRAs by integer id, and peers
shipped "stale adapter served" bugs where a request named the new policy and sampled the old one (TRL #6344, SkyRL
#1680). So every check of "version v was served by adapter v" compares vLLM's sampling log-probs of the tokens it drew
with the trainer's teacher-forced log-probs of those tokens (float32 PEFT forward on the GPU) under adapter v and
under the other adapters: the right adapter agrees to bf16 rounding, a wrong one is off by tenths of a nat.

Tolerances (bf16 against float32). bf16 keeps 8 significant bits: a logit z carries a rounding error of about
|z| * 2^-9 at every layer, and vLLM runs weights, activations, KV cache and LoRA in bf16 while the trainer runs
float32. On this model's O(1) logits (`rl.gpu.VLLM_MODEL`), the model cast to bf16 against float32 on the CPU moved
sampled-token log-probs by 0.007 on average and 0.035 at most; the bounds below give vLLM's kernels ~4x (mean) and
~7x (max) room over that. Two different random adapters differ by ~0.6 on average, so the wrong-adapter margin
(0.2, and 5x the right one's gap) cannot be met by rounding.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from gpu_helpers import digit_prompt, logprob_gaps, random_adapter, summarize, trainer_policy

from rl.types import ArtifactRef, Prompt, Rollout, RolloutRequest

pytestmark = [pytest.mark.gpu, pytest.mark.vllm]

MEAN_ABS_TOL = 0.03  # mean |vLLM bf16 log-prob - trainer float32 log-prob| over all sampled tokens
MAX_ABS_TOL = 0.25  # the largest single-token gap
WRONG_ADAPTER_MIN_MEAN = 0.2  # a different adapter's mean gap is at least this ...
WRONG_ADAPTER_RATIO = 5.0  # ... and at least this many times the right adapter's
# Policy versions of this module's adapters: 100 and up, clear of the driver's 0, 1, 2 on the shared engine.
V_A, V_B = 100, 101


def _request(
    adapter: ArtifactRef, version: int, *, seed: int, n: int = 8, max_tokens: int = 16, prompt: int = 3, group: int = 0
) -> RolloutRequest:
    question, answer = digit_prompt(prompt)
    return RolloutRequest(
        group_id=group,
        prompt=Prompt(question=question, answer=answer),
        n=n,
        adapter=adapter,
        policy_version=version,
        seed=seed,
        max_tokens=max_tokens,
    )


def _generate(engine: Any, request: RolloutRequest) -> list[Rollout]:
    group: list[Rollout] = asyncio.run(engine.generate(request))
    assert len(group) == request.n
    for r in group:
        assert r.policy_version == request.policy_version and r.seed == request.seed and r.group_id == request.group_id
        assert 1 <= len(r.token_ids) == len(r.logprobs) <= request.max_tokens
    return group


@pytest.fixture(scope="module")
def adapters(gpu_model_dir: Path, gpu_store: Any) -> dict[int, tuple[ArtifactRef, dict[str, bytes]]]:
    """Two random rank-8 adapters, stored for the engine: version -> (ref, files)."""
    out = {}
    for version, seed in ((V_A, 1), (V_B, 2)):
        files = random_adapter(gpu_model_dir, seed=seed)
        out[version] = (asyncio.run(gpu_store.put(files, name=f"gpu-test-adapter-v{version}")), files)
    return out


@pytest.fixture(scope="module")
def policies(gpu_model_dir: Path, adapters: dict[int, tuple[ArtifactRef, dict[str, bytes]]]) -> dict[int, Any]:
    """The trainer's float32 view of each adapter, on the GPU."""
    import torch

    return {v: trainer_policy(gpu_model_dir, files, torch.device("cuda", 0)) for v, (_, files) in adapters.items()}


def test_a_seeded_group_is_reproducible(vllm_engine: Any, adapters: Any, gpu_report: Any) -> None:
    """The same request (prompt, adapter, seed) gives the same tokens and log-probs, with other sampling in between:
    the seed decides, not the engine's state. Same engine and shapes, so the bits should match; 1e-5 allows only
    kernel noise. (vLLM seeds the n samples of a group seed, seed+1, ..., seed+n-1.)"""
    ref, _ = adapters[V_A]
    first = _generate(vllm_engine, _request(ref, V_A, seed=1234))
    _generate(vllm_engine, _request(ref, V_A, seed=99, prompt=7))
    _generate(vllm_engine, _request(adapters[V_B][0], V_B, seed=1234))
    again = _generate(vllm_engine, _request(ref, V_A, seed=1234))
    assert [r.token_ids for r in again] == [r.token_ids for r in first]
    worst = max(
        abs(a - b) for r1, r2 in zip(first, again, strict=True) for a, b in zip(r1.logprobs, r2.logprobs, strict=True)
    )
    gpu_report(tokens=sum(len(r.token_ids) for r in first), max_logprob_diff=f"{worst:.1e}")
    assert worst <= 1e-5, f"a replayed group's log-probs moved by {worst}"


def test_the_samples_of_one_group_differ(vllm_engine: Any, adapters: Any) -> None:
    """n=8 samples of up to 16 tokens from ~40-way distributions: a repeat is rare (two samples that stop at once on
    <eos> can tie), so at least 6 distinct sequences; all 8 identical would mean one random stream for the group."""
    group = _generate(vllm_engine, _request(adapters[V_A][0], V_A, seed=7, n=8))
    distinct = {tuple(r.token_ids) for r in group}
    assert len(distinct) >= 6, [r.token_ids for r in group]


def test_each_version_is_served_by_its_own_adapter(
    vllm_engine: Any, adapters: Any, policies: dict[int, Any], gpu_report: Any
) -> None:
    """Versions requested in the order A, B, A, B (a stale-by-id cache would serve the previous adapter): each group
    records the version it asked for, and its tokens' vLLM log-probs match that version's adapter (mean gap <= 0.03)
    while the other adapter's are far off (mean gap >= 0.2 and >= 5x)."""
    rows = []
    for i, version in enumerate((V_A, V_B, V_A, V_B)):
        other = V_B if version == V_A else V_A
        group = _generate(vllm_engine, _request(adapters[version][0], version, seed=500 + i, prompt=i, group=i))
        assert {r.policy_version for r in group} == {version}
        own = summarize(logprob_gaps(group, policies[version]))
        wrong = summarize(logprob_gaps(group, policies[other]))
        rows.append(f"request {i} (v{version}): own {own}; other adapter mean {wrong.mean:.3f}")
        assert own.mean <= MEAN_ABS_TOL, rows[-1]
        assert wrong.mean >= WRONG_ADAPTER_MIN_MEAN and wrong.mean >= WRONG_ADAPTER_RATIO * own.mean, rows[-1]
    gpu_report(served="\n".join(rows))


def test_vllm_sampling_logprobs_agree_with_the_trainers_teacher_forced_logprobs(
    vllm_engine: Any, adapters: Any, policies: dict[int, Any], gpu_report: Any
) -> None:
    """The importance ratio's two sides: vLLM's sampling log-probs (bf16, logprobs=0) against the trainer's
    teacher-forced log-probs (float32 PEFT forward) for the same tokens and adapter, over 4 prompts x 8 samples x up to
    32 tokens: mean |Δ| <= 0.03 and max |Δ| <= 0.25 (see the module docstring for why)."""
    ref, _ = adapters[V_B]
    rollouts = [
        r
        for g in range(4)
        for r in _generate(vllm_engine, _request(ref, V_B, seed=900 + g, n=8, max_tokens=32, prompt=g, group=g))
    ]
    gaps = summarize(logprob_gaps(rollouts, policies[V_B]))
    gpu_report(mean_abs_delta=f"{gaps.mean:.4f}", max_abs_delta=f"{gaps.max:.4f}", tokens=gaps.tokens)
    assert gaps.mean <= MEAN_ABS_TOL, str(gaps)
    assert gaps.max <= MAX_ABS_TOL, str(gaps)
