"""The trainer's teacher-forced log-probs are those of the distribution the engine sampled from: a law on the function a
trainer scores tokens with (`Implementation.token_logprobs`), on a tiny causal LM the law builds itself.

Why: the loss's importance ratio divides the trainer's log-prob of a token by the engine's; when the engine samples at a
temperature T (and under a top-k or top-p cut) and the trainer scores the token under softmax(logits) instead of
softmax(logits / T), every ratio is off by a factor that grows with the logit's size, with no error anywhere. TRL
shipped this until its PR #3029 (0.16.0: `_get_per_token_logps` divides the logits by the temperature); TRL #4159 is
the same gap on the engine's side (vLLM's log-probs reported before the temperature: a first-token ratio of 2.0 at
T = 0.6).
"""

from __future__ import annotations

import functools
import math
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from rl.conformance.algorithm_spec import AlgorithmSpec, check_spec
from rl.conformance.support.contract_base import ContractBase, must_provide, tier
from rl.types import SamplingSettings

__all__ = ["SETTINGS", "TokenLogprobContract", "declared_logprobs"]

SETTINGS = {
    "temperature": SamplingSettings(temperature=0.6),
    "top_k": SamplingSettings(temperature=0.8, top_k=4),
    "top_p": SamplingSettings(temperature=1.3, top_p=0.6),
    "default": SamplingSettings(),
}
"""The settings the law scores at: TRL #4159's T = 0.6, a top-k and a top-p cut (each tempered), and the default."""
TOLERANCE = 2e-4
"""How far a float32 log-prob may be from the float64 reference (the law's logits are the model's float32 ones)."""
PROMPTS = ([1, 5, 6], [1, 7, 6], [1, 9, 6])
"""Three prompts of one length (no padding for the function to get right: another law's business)."""
COMPLETION_TOKENS = 4


def declared_logprobs(logits: Sequence[float], sampling: SamplingSettings, truncation: str) -> list[float]:
    """Float64 reference: each token's log-prob under `sampling`'s distribution over `logits`, as `truncation`
    (`AlgorithmSpec.logprob_truncation`) declares: "renormalised" over the top-k/top-p cut (cut tokens -inf), or
    "ignored" (log softmax(logits / T) over every token). The cut is vLLM's and transformers' rule: below the k-th
    largest tempered logit (ties kept), or in the ascending tail whose mass is <= 1 - top_p (the top token kept)."""
    scores = [float(x) / sampling.temperature for x in logits]
    kept = [True] * len(scores)
    if truncation == "renormalised":
        if 0 < sampling.top_k < len(scores):
            kth = sorted(scores, reverse=True)[sampling.top_k - 1]
            kept = [x >= kth for x in scores]
        if sampling.top_p < 1.0:
            probs = _softmax([x if k else -math.inf for x, k in zip(scores, kept, strict=True)])
            ascending = sorted(range(len(probs)), key=lambda j: probs[j])
            mass = 0.0
            for position, j in enumerate(ascending):
                mass += probs[j]
                if mass <= 1.0 - sampling.top_p and position < len(ascending) - 1:
                    kept[j] = False
    top = max(x for x, k in zip(scores, kept, strict=True) if k)
    log_z = top + math.log(math.fsum(math.exp(x - top) for x, k in zip(scores, kept, strict=True) if k))
    return [x - log_z if k else -math.inf for x, k in zip(scores, kept, strict=True)]


def _softmax(xs: Sequence[float]) -> list[float]:
    top = max(xs)
    exps = [math.exp(x - top) for x in xs]
    total = math.fsum(exps)
    return [e / total for e in exps]


@functools.cache
def law_model() -> Any:
    """The tiny causal LM the law scores with (transformers; built once per process from a fixed seed)."""
    from rl.models import TinyModelConfig, build_tiny_model, load_base_model
    from rl.models.opened_model import open_model

    config = TinyModelConfig(seed=11, hidden_size=32, layers=2, heads=4, kv_heads=2, intermediate=64)
    with tempfile.TemporaryDirectory(prefix="rl-conformance-logprob-model-") as root:  # in memory once loaded
        base = open_model(build_tiny_model(Path(root) / "base", config))
        return load_base_model(base)


def _logits(model: Any, ids: list[int]) -> list[list[float]]:
    import torch

    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids], dtype=torch.long), use_cache=False).logits[0]  # [L, V]
    return out.double().tolist()


def _greedy(model: Any, prompt: list[int]) -> list[int]:
    """The greedy continuation: its tokens are the most probable, so every cut keeps them."""
    ids = list(prompt)
    for _ in range(COMPLETION_TOKENS):
        last = _logits(model, ids)[-1]
        ids.append(max(range(len(last)), key=lambda j: last[j]))
    return ids[len(prompt) :]


@tier("token_logprobs")
class TokenLogprobContract(ContractBase):
    """Laws of the function a trainer teacher-forces log-probs with. Provide `token_logprobs`: called as
    `token_logprobs(model, prompts, completions, sampling)` with a transformers causal LM, equal-length prompts and
    completions (lists of token ids) and a `rl.types.SamplingSettings`, it returns each completion token's log-prob
    (a `[B, T]` tensor or nested lists), as your trainer computes them for the loss. `algorithm` declares
    `logprob_truncation`."""

    @pytest.fixture
    def token_logprobs(self) -> Any:
        """Return the trainer's log-prob function (see the class docstring)."""
        raise must_provide(
            "TokenLogprobContract",
            "token_logprobs",
            "a function (model, prompts, completions, sampling) -> [B, T] log-probs, as your trainer scores tokens",
        )

    @pytest.fixture
    def algorithm(self) -> AlgorithmSpec:
        """Return the `AlgorithmSpec` whose `logprob_truncation` the law checks; the default is ours."""
        return AlgorithmSpec()

    @pytest.mark.parametrize("case", list(SETTINGS))
    def test_token_logprobs_are_those_of_the_sampling_distribution(
        self, token_logprobs: Any, algorithm: AlgorithmSpec, case: str
    ) -> None:
        """At temperature T (and under a top-k or top-p cut), every completion token's teacher-forced log-prob is
        its log-prob under softmax(logits / T), renormalised over the cut as `logprob_truncation` declares (float64
        reference from the model's logits): a trainer that scores at temperature 1 while the engine samples at T
        fails (TRL before PR #3029)."""
        spec = check_spec(algorithm)
        sampling = SETTINGS[case]
        model = law_model()
        prompts = [list(p) for p in PROMPTS]
        completions = [_greedy(model, p) for p in prompts]
        got = token_logprobs(model, prompts, completions, sampling)
        rows = got.tolist() if hasattr(got, "tolist") else [list(r) for r in got]
        assert len(rows) == len(prompts), f"token_logprobs returned {len(rows)} rows for {len(prompts)} completions"
        for b, (prompt, completion) in enumerate(zip(prompts, completions, strict=True)):
            logits = _logits(model, prompt + completion)
            assert len(rows[b]) == len(completion), (
                f"row {b}: {len(rows[b])} log-probs for a completion of {len(completion)} tokens"
            )
            for t, token in enumerate(completion):
                want = declared_logprobs(logits[len(prompt) - 1 + t], sampling, spec.logprob_truncation)[token]
                untempered = declared_logprobs(logits[len(prompt) - 1 + t], SamplingSettings(), "ignored")[token]
                have = float(rows[b][t])
                hint = (
                    " It is the log-prob at temperature 1: divide the logits by the sampling temperature before the "
                    "log-softmax (TRL PR #3029)"
                    if abs(have - untempered) <= TOLERANCE and sampling.temperature != 1.0
                    else ""
                )
                assert abs(have - want) <= TOLERANCE, (
                    f"{case} ({sampling}): token {t} ({token}) of completion {b} got log-prob {have!r}; the "
                    f"distribution sampled gives {want!r} under logprob_truncation={spec.logprob_truncation!r} "
                    f"(tolerance {TOLERANCE}).{hint}. The trainer must score tokens under the distribution the engine "
                    "draws them from, or the importance ratio is biased"
                )
