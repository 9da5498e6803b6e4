"""The real `VLLMEngine` on vLLM's CPU build: which adapter each group is sampled from, and its seeds.

Which adapter served a group is read from what it computed, never from names: the group's sampling log-probs equal
one adapter's teacher-forced log-probs (float32, `LOGPROB_MAX_ABS_TOL`) and are far from every other's.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path
from typing import Any

from gpu_helpers import logprob_gaps, summarize
from vllm_cpu_helpers import LOGPROB_MAX_ABS_TOL, generate, request, served_by

from rl.samplers.vllm import VLLMEngine
from rl.samplers.vllm_requests import VLLM_SEED_STRIDE
from rl.types import Prompt


def test_a_new_adapter_version_is_served_on_the_next_call(engine: Any, adapters: Any, policies: Any) -> None:
    """Version 1 then version 2 (another adapter) on the next call: each call samples the version it names."""
    (v1,) = generate(engine, request(adapters["a"][0], version=1, seed=10))
    (v2,) = generate(engine, request(adapters["b"][0], version=2, seed=10))
    assert [served_by(v1, policies), served_by(v2, policies)] == ["a", "b"]


def test_a_second_run_on_a_warm_engine_never_samples_the_first_runs_adapter(
    engine: Any, adapters: Any, policies: Any, model_dir: Path, tmp_path: Path
) -> None:
    """Run one serves its version 0 (adapter a) on the warm engine; run two's version 0 is another adapter (c),
    fetched from run two's own store, under the same version label and seed: it is served, not run one's."""
    from rl.storage.artifacts import LocalArtifacts

    (first,) = generate(engine, request(adapters["a"][0], version=0, seed=20))
    second_store = LocalArtifacts(tmp_path / "run-two")
    ref = asyncio.run(second_store.put(adapters["c"][1], name="adapter-v0"))
    engine.artifacts, saved = second_store, engine.artifacts  # the replica's next run reads its own store
    try:
        (second,) = generate(engine, request(ref, version=0, seed=20))
    finally:
        engine.artifacts = saved
    assert [served_by(first, policies), served_by(second, policies)] == ["a", "c"]


def test_one_call_gives_each_group_the_adapter_it_names_and_the_samples_it_gets_alone(
    engine: Any, adapters: Any, policies: Any
) -> None:
    """Groups naming adapters a, b, c, a in one `generate` call: each is sampled from its own adapter, and each equals
    the group the same request gives in a call of its own (a group's seed, not its batch, decides its samples)."""
    names = ["a", "b", "c", "a"]
    requests = [request(adapters[n][0], seed=30 + g, group=g, prompt=g) for g, n in enumerate(names)]
    together = generate(engine, *requests)
    assert [served_by(group, policies) for group in together] == names
    alone = [generate(engine, r)[0] for r in requests]
    assert [[r.token_ids for r in g] for g in together] == [[r.token_ids for r in g] for g in alone]
    worst = max(
        abs(x - y)
        for ga, gb in zip(together, alone, strict=True)
        for ra, rb in zip(ga, gb, strict=True)
        for x, y in zip(ra.logprobs, rb.logprobs, strict=True)
    )
    assert worst <= LOGPROB_MAX_ABS_TOL, f"a group's log-probs moved by {worst} with the batch it was sampled in"


def test_a_call_over_the_schedulers_token_budget_samples_every_seeded_group(engine: Any, adapters: Any) -> None:
    """Seeded groups whose prompts, together, exceed one scheduler step's token budget (`max_num_batched_tokens`):
    vLLM's CPU build crashed its engine core on them ("CPU Generator does not use offset") when a prompt was split
    across steps, as a real model's ~45-token chat prompts are in the demo's held-out evaluation. Every group comes
    back, and as it comes alone."""
    budget = engine.llm.llm_engine.vllm_config.scheduler_config.max_num_batched_tokens
    long_question = "0123456789" * 4 + "="  # ~41 tokens of the digit vocabulary
    groups, n = 8, 32  # 256 sequences (vLLM's max_num_seqs on the CPU): 8 x 32 x 41 tokens > 4,096
    prompt_tokens = len(engine.tokenizer(long_question)["input_ids"])
    assert groups * n * prompt_tokens > budget, (prompt_tokens, budget)
    requests = [
        replace(request(adapters["a"][0], seed=1200 + g, group=g, n=n, max_tokens=2), prompt=Prompt(long_question, "0"))
        for g in range(groups)
    ]
    together = generate(engine, *requests)
    alone = generate(engine, requests[-1])[0]
    assert [r.token_ids for r in together[-1]] == [r.token_ids for r in alone]


def test_the_same_request_gives_the_same_rollouts(engine: Any, adapters: Any) -> None:
    """A retried request (same prompt, adapter, seed) returns identical rollouts, after other sampling in between."""
    req = request(adapters["b"][0], seed=1234, max_tokens=16)
    first = generate(engine, req)
    generate(engine, request(adapters["a"][0], seed=99, prompt=7), request(adapters["c"][0], seed=1234))
    assert generate(engine, req) == first


def test_two_group_seeds_never_share_per_sample_seeds(engine: Any, adapters: Any, model_dir: Path) -> None:
    """vLLM samples completion i of a request seeded s with seed s + i, so requests seeded s and s + 1 share n - 1
    completions (shown on the engine's own `LLM`); the engine spaces group seeds `VLLM_SEED_STRIDE` apart, so groups
    seeded s and s + 1 share none."""
    ref = adapters["a"][0]
    s = 4242
    raw = [_raw_generate(engine, ref, seed) for seed in (s * VLLM_SEED_STRIDE, s * VLLM_SEED_STRIDE + 1)]
    assert raw[0][1:] == raw[1][:-1], "vLLM no longer seeds completion i with seed + i: revisit VLLM_SEED_STRIDE"
    a, b = (generate(engine, request(ref, seed=seed, max_tokens=16))[0] for seed in (s, s + 1))
    assert [r.token_ids for r in a] == raw[0]  # the engine passes s * VLLM_SEED_STRIDE
    shared = {tuple(r.token_ids) for r in a} & {tuple(r.token_ids) for r in b}
    assert not shared, f"groups seeded {s} and {s + 1} share completions {sorted(shared)}"


def _raw_generate(engine: VLLMEngine, ref: Any, seed: int) -> list[list[int]]:
    """The completions' token ids of one request sent to the engine's `LLM` directly, with `seed` as it is."""
    import vllm

    from rl.samplers.vllm_requests import sampling_params_kwargs

    req = request(ref, seed=0, max_tokens=16)
    params = vllm.SamplingParams(**{**sampling_params_kwargs(req), "seed": seed})
    adapter_dir = asyncio.run(engine._adapter_dir(ref))
    lora = engine._lora_request(req.policy_version, ref.digest, adapter_dir)
    ids = engine.tokenizer(req.prompt.question)["input_ids"]
    (out,) = engine.llm.generate([{"prompt_token_ids": ids}], params, lora_request=lora, use_tqdm=False)
    return [list(c.token_ids) for c in sorted(out.outputs, key=lambda c: c.index)]


def test_recorded_logprobs_equal_the_trainers_teacher_forced_logprobs(
    engine: Any, adapters: Any, policies: Any, record_property: Any
) -> None:
    """The importance ratio's two sides, both float32: vLLM's sampling log-probs (`logprobs=0`, raw) against the
    trainer's teacher-forced log-probs (the unmerged PEFT forward) of the same tokens under the same adapter, over
    4 prompts x 8 samples x up to 16 tokens: every token within `LOGPROB_MAX_ABS_TOL` (why that bound: see
    vllm_cpu_helpers)."""
    ref = adapters["b"][0]
    groups = generate(engine, *(request(ref, seed=900 + g, prompt=g, group=g, max_tokens=16) for g in range(4)))
    gaps = summarize(logprob_gaps([r for g in groups for r in g], policies["b"]))
    line = f"mean |Δ| {gaps.mean:.2e}, max |Δ| {gaps.max:.2e} over {gaps.tokens} tokens"
    record_property("logprob_gap", line)
    print(f"vLLM (CPU, float32) vs trainer log-probs: {line}")
    assert gaps.max <= LOGPROB_MAX_ABS_TOL, str(gaps)
