"""The sampler's fidelity laws, mixed into `RolloutEngineContract`: the log-probs an engine records are those of the
distribution it sampled from, and one call that names several adapters samples each request from its own.

Why these two: the loss divides by the recorded probability (the importance ratio's denominator), so an engine that
samples at one setting (a temperature, a top-k or top-p cut) and records the log-probs of another trains on a biased
ratio with no error anywhere; and a batching engine that deduplicates or buckets the requests of one call without the
adapter hands one adapter's samples to another request, which no single-request law can see.
"""

from __future__ import annotations

import asyncio
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from rl.conformance.law_sizes import LawSizes
from rl.conformance.support.contract_base import Run, tier
from rl.protocols import RolloutEngine
from rl.seeding import derive_seed
from rl.types import ArtifactRef, Rollout, RolloutRequest

__all__ = ["SamplerFidelityLaws", "frequency_test"]

DRAWS = 4096
"""Samples of the first token drawn for the frequency law at the full size (`LawSizes` may declare fewer)."""
GROUP_DRAWS = 64
"""Samples per request: the draws come as `DRAWS // GROUP_DRAWS` groups, each with its own seed, since an engine may
refuse a group as large as `DRAWS` (ours on vLLM spaces group seeds 256 apart, so it refuses n > 256)."""
FALSE_ALARM = 1e-6
"""The chance a correct sampler fails the frequency law at a given seed (the law is deterministic at that seed)."""
_Z_FALSE_ALARM = 4.753424  # the standard normal's upper 1e-6 quantile
MIN_EXPECTED = 16.0
"""Each bin of the chi-square test expects at least this many draws, so the chi-square approximation holds."""
LOGPROB_TOLERANCE = 1e-4
"""How far two records of one token's log-prob at one position may differ (float rounding within a batch)."""


def _chi_square_critical(df: int) -> float:
    """The chi-square quantile with upper tail `FALSE_ALARM` (Wilson-Hilferty; within 1% for df >= 1 at this tail)."""
    h = 2.0 / (9.0 * df)
    return df * (1.0 - h + _Z_FALSE_ALARM * math.sqrt(h)) ** 3


def frequency_test(counts: dict[int, int], probs: dict[int, float]) -> tuple[float, float, list[tuple[float, int]]]:
    """Pearson's chi-square of observed token counts against recorded probabilities: each token expected at least
    `MIN_EXPECTED` times is a bin of its own, and every other token, drawn or not, shares the last bin (1 - the
    binned tokens' mass). Only drawn tokens have a recorded probability, so a bin of rarely drawn ones would hold a
    draw for each by selection; a token this probable is drawn whatever the seed (missed with chance e^-16). Returns
    (statistic, critical value at `FALSE_ALARM`, [(expected, observed)] per bin)."""
    total = sum(counts.values())
    bins = [
        (total * probs[token], counts.get(token, 0))
        for token in sorted(probs, key=lambda t: -probs[t])
        if total * probs[token] >= MIN_EXPECTED
    ]
    rest = (total - sum(e for e, _ in bins), total - sum(o for _, o in bins))
    if bins and rest[0] < MIN_EXPECTED:
        last_e, last_o = bins.pop()
        rest = (rest[0] + last_e, rest[1] + last_o)
    if rest[0] > 0.0 or rest[1]:
        bins.append(rest)
    if len(bins) < 2:
        return 0.0, math.inf, bins
    statistic = sum((o - e) ** 2 / e if e > 0 else math.inf for e, o in bins)
    return statistic, _chi_square_critical(len(bins) - 1), bins


async def _concurrently(engine: RolloutEngine, requests: Sequence[RolloutRequest]) -> list[list[Rollout]]:
    """One call: `generate_groups` when the engine batches, else every `generate` in flight at once (what an engine
    that batches concurrent requests internally, like a vLLM server, sees as one batch)."""
    batched = getattr(engine, "generate_groups", None)
    if callable(batched):
        return list(await batched(list(requests)))
    return list(await asyncio.gather(*(engine.generate(r) for r in requests)))


def first_difference(a: Sequence[Rollout], b: Sequence[Rollout]) -> str | None:
    if [r.token_ids for r in a] != [r.token_ids for r in b]:
        return f"token ids {[r.token_ids for r in a]} instead of {[r.token_ids for r in b]}"
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        if any(abs(p - q) > LOGPROB_TOLERANCE for p, q in zip(x.logprobs, y.logprobs, strict=True)):
            return f"rollout {i}'s log-probs {x.logprobs} instead of {y.logprobs}"
    return None


@tier("engine")
class SamplerFidelityLaws:
    """Needs the `engine`, `rollout_request`, `other_adapter`, `law_sizes` and `rl_run` fixtures of
    `RolloutEngineContract`."""

    def test_engine_recorded_logprobs_are_those_of_the_distribution_it_samples(
        self, engine: RolloutEngine, rollout_request: RolloutRequest, law_sizes: LawSizes, rl_run: Run[Any]
    ) -> None:
        """The first tokens of many draws (64 seeded groups of 64, or the declared `LawSizes` share of them) occur as
        often as the probabilities the engine records for them say (a chi-square test at a fixed seed, false-alarm
        chance 1e-6), and one token records one log-prob: sampling at one temperature, top-k or top-p while recording
        another's log-probs fails."""
        group = [
            rollout
            for chunk in range(law_sizes.groups(DRAWS // GROUP_DRAWS))
            for rollout in rl_run(
                engine.generate(
                    replace(
                        rollout_request,
                        n=GROUP_DRAWS,
                        max_tokens=1,
                        seed=derive_seed("conformance.engine.frequencies", rollout_request.seed, chunk),
                    )
                )
            )
        ]
        counts: Counter[int] = Counter()
        probs: dict[int, float] = {}
        for i, r in enumerate(group):
            assert r.token_ids and len(r.logprobs) == len(r.token_ids), (
                f"rollout {i} of a max_tokens=1 request has token ids {r.token_ids} and log-probs {r.logprobs}"
            )
            token, logprob = r.token_ids[0], r.logprobs[0]
            counts[token] += 1
            first = probs.setdefault(token, math.exp(logprob))
            assert abs(math.log(first) - logprob) <= LOGPROB_TOLERANCE, (
                f"token {token} as the first token of one prompt recorded the log-probs {math.log(first)!r} and "
                f"{logprob!r}: one token at one position of one prompt has one probability under one adapter"
            )
        mass = sum(probs.values())
        assert mass <= 1.0 + LOGPROB_TOLERANCE, (
            f"the {len(probs)} distinct first tokens recorded probabilities summing to {mass!r} > 1: they are not "
            "the probabilities of the distribution sampled (recorded at another temperature or before a top-k/top-p "
            "renormalisation?)"
        )
        statistic, critical, bins = frequency_test(dict(counts), probs)
        worst = max(bins, key=lambda b: (b[1] - b[0]) ** 2 / b[0] if b[0] > 0 else math.inf)
        assert statistic <= critical, (
            f"{len(group)} samples of the first token do not follow the log-probs the engine recorded for them: "
            f"chi-square {statistic:.1f} over {len(bins)} bins > {critical:.1f} (false-alarm chance {FALSE_ALARM}); "
            f"worst bin expected {worst[0]:.1f} draws from the recorded probabilities and got {worst[1]} "
            f"({len(counts)} distinct tokens seen, recorded mass {mass:.4f}). The engine samples from another "
            "distribution than the one it records (a temperature, top-k or top-p applied to sampling only?): "
            "record the log-probs of the distribution you sample from"
        )

    def test_engine_one_call_serves_each_request_its_own_adapter(
        self, engine: RolloutEngine, rollout_request: RolloutRequest, other_adapter: ArtifactRef, rl_run: Run[Any]
    ) -> None:
        """Requests that differ only in the adapter they name, sent in one call (`generate_groups`, or concurrently),
        each get what that request alone gets: a batch keyed or deduplicated without the adapter fails."""
        mine = rollout_request
        other = replace(rollout_request, group_id=rollout_request.group_id + 1, adapter=other_adapter)
        alone = {id(r): rl_run(engine.generate(r)) for r in (mine, other)}
        for order in ((mine, other), (other, mine)):
            together = rl_run(_concurrently(engine, order))
            assert len(together) == len(order), f"one call of {len(order)} requests returned {len(together)} groups"
            for request, group in zip(order, together, strict=True):
                difference = first_difference(group, alone[id(request)])
                assert difference is None, (
                    f"in one call with requests for adapters {[r.adapter.digest[:19] for r in order]} (same prompt, "
                    f"seed and policy-version label), the request for adapter {request.adapter.digest[:19]} got "
                    f"{difference} it gets alone: the engine batched or cached the call's requests without their "
                    "adapter. Key every batch, bucket and cache by the adapter's digest"
                )
