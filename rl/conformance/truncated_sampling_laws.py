"""The engine's law at a temperature and under a top-k or top-p cut, mixed into `RolloutEngineContract`: the log-probs
it records are those of the declared tempered, truncated distribution, and it draws from that distribution.

Why: users sample at T != 1 with top-p or top-k on; the loss divides by the recorded probability, so an engine that
records log-probs before the temperature (TRL #4159: vLLM's raw log-probs, a first-token ratio of 2.0 at T = 0.6) or
before the cut's renormalisation biases every importance ratio with no error anywhere.

The law needs no access to the model: the engine's own records at the default settings (which the frequency law ties to
what it draws, and the trainer laws to teacher forcing) give the first token's log-probs log p(t), and the declared
distribution follows from them: p(t)^(1/T), cut and renormalised. The tokens never drawn at the default carry the mass
the records leave (at most 1 - their sum, less still after a temperature below 1), which bounds the only unknown.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import replace
from typing import Any

import pytest

from rl.conformance.algorithm_spec import AlgorithmSpec, check_spec
from rl.conformance.law_sizes import LawSizes
from rl.conformance.sampler_fidelity_laws import DRAWS, GROUP_DRAWS, LOGPROB_TOLERANCE, frequency_test
from rl.conformance.support.contract_base import Run, tier
from rl.protocols import RolloutEngine
from rl.seeding import derive_seed
from rl.types import RolloutRequest, SamplingSettings

__all__ = ["CUTS", "TEMPERATURE", "TruncatedSamplingLaws"]

TEMPERATURE = 0.7
"""Below 1, so the mass of the tokens never drawn at the default shrinks under it (p^(1/T) <= p)."""
CUTS = ("temperature", "top_k", "top_p")
TOP_K = 3
KEEP_TOP_P = 3
"""The law sets top_p halfway between the tempered mass of the 2 and of the 3 most probable first tokens: it keeps 3."""


def _first_tokens(
    engine: RolloutEngine, request: RolloutRequest, sampling: SamplingSettings, sizes: LawSizes, run: Run[Any]
) -> tuple[Counter[int], dict[int, float]]:
    """The first tokens of many draws at `sampling` and the one log-prob recorded for each (asserted to be one)."""
    counts: Counter[int] = Counter()
    logps: dict[int, float] = {}
    for chunk in range(sizes.groups(DRAWS // GROUP_DRAWS)):
        seed = derive_seed("conformance.engine.truncated", request.seed, chunk, repr(sampling))
        asked = replace(request, n=GROUP_DRAWS, max_tokens=1, seed=seed, sampling=sampling)
        for r in run(engine.generate(asked)):
            assert r.token_ids and len(r.logprobs) == len(r.token_ids), (
                f"a max_tokens=1 request at {sampling} returned token ids {r.token_ids} and log-probs {r.logprobs}"
            )
            token, lp = r.token_ids[0], r.logprobs[0]
            counts[token] += 1
            first = logps.setdefault(token, lp)
            assert abs(first - lp) <= LOGPROB_TOLERANCE, (
                f"at {sampling} the first token {token} recorded the log-probs {first!r} and {lp!r}: one token at one "
                "position of one prompt has one probability"
            )
    return counts, logps


@tier("engine")
class TruncatedSamplingLaws:
    """Needs `engine`, `rollout_request`, `law_sizes` and `rl_run` (`RolloutEngineContract`'s) and `algorithm` (its
    `logprob_truncation`; ours by default)."""

    @pytest.fixture
    def algorithm(self) -> AlgorithmSpec:
        """Return the `AlgorithmSpec` whose `logprob_truncation` the engine's records follow; the default is ours."""
        return AlgorithmSpec()

    @pytest.mark.parametrize("cut", CUTS)
    def test_engine_records_the_tempered_truncated_distribution_it_samples(
        self,
        engine: RolloutEngine,
        rollout_request: RolloutRequest,
        algorithm: AlgorithmSpec,
        law_sizes: LawSizes,
        rl_run: Run[Any],
        cut: str,
    ) -> None:
        """At temperature 0.7, alone and with a top-k (3) or top-p cut (set to keep 3 tokens), the first token's
        recorded log-prob is log p(t)/T less the log of the normaliser the declared `logprob_truncation` gives (over
        the cut, or over every token), p taken from the engine's own records at the default settings; every draw lies
        inside the cut; and the draws follow the cut, renormalised distribution (chi-square, false-alarm 1e-6).
        Recording log-probs before the temperature or the renormalisation, or sampling without the cut, fails."""
        spec = check_spec(algorithm)
        base_counts, base = _first_tokens(engine, rollout_request, SamplingSettings(), law_sizes, rl_run)
        unseen = max(0.0, 1.0 - math.fsum(math.exp(lp) for lp in base.values()))
        tempered = {t: lp / TEMPERATURE for t, lp in base.items()}  # log of p^(1/T), up to one constant
        ranked = sorted(tempered, key=lambda t: -tempered[t])
        unseen_weight = unseen ** (1 / TEMPERATURE)  # the never-drawn tokens' tempered weight is at most this
        total = math.fsum(math.exp(x) for x in tempered.values())
        if cut == "temperature":
            sampling, kept = SamplingSettings(temperature=TEMPERATURE), set(ranked)
        else:
            k = TOP_K if cut == "top_k" else KEEP_TOP_P
            if len(ranked) <= k or math.exp(base[ranked[k - 1]]) <= unseen:
                pytest.skip(
                    f"the prompt's first token drew {len(ranked)} distinct tokens at the default (mass left "
                    f"{unseen:.3g}): too few to place a cut that keeps {k}; sample a prompt with a wider distribution"
                )
            kept = set(ranked[:k])
            if cut == "top_k":
                sampling = SamplingSettings(temperature=TEMPERATURE, top_k=k)
            else:
                within = math.fsum(math.exp(tempered[t]) for t in ranked[: k - 1]) / total  # the most it can be
                reaching = math.fsum(math.exp(tempered[t]) for t in ranked[:k]) / (total + unseen_weight)
                if not within < reaching:
                    pytest.skip("the first token's tempered masses leave no top_p that surely keeps 3 tokens")
                sampling = SamplingSettings(temperature=TEMPERATURE, top_p=(within + reaching) / 2)
        counts, recorded = _first_tokens(engine, rollout_request, sampling, law_sizes, rl_run)
        outside = sorted(set(recorded) - kept)
        if cut == "temperature":  # no cut: a token the default's draws never showed may come up; judged on the rest
            counts = Counter({t: c for t, c in counts.items() if t in kept})
            recorded = {t: lp for t, lp in recorded.items() if t in kept}
            outside = []
        assert not outside, (
            f"at {sampling} the engine drew first tokens {outside}, outside the cut {sorted(kept)} (the "
            f"{len(kept)} most probable of its records at the default): it samples without the top-k/top-p cut"
        )
        kept_total = math.fsum(math.exp(tempered[t]) for t in kept)
        low = high = math.log(kept_total)  # the log-normaliser's bounds
        if cut == "temperature" or spec.logprob_truncation == "ignored":
            low, high = math.log(total), math.log(total + unseen_weight)
        tolerance = LOGPROB_TOLERANCE * (1.0 + 2.0 / TEMPERATURE)
        for token, lp in sorted(recorded.items()):
            want_high, want_low = tempered[token] - low, tempered[token] - high
            untempered = base[token]
            hint = (
                " It is the log-prob at temperature 1: record the log-probs after the temperature (vLLM: "
                "logprobs_mode='processed_logprobs'; TRL #4159)"
                if abs(lp - untempered) <= tolerance
                else ""
            )
            assert want_low - tolerance <= lp <= want_high + tolerance, (
                f"at {sampling} the first token {token} recorded log-prob {lp!r}; its log-prob at the default is "
                f"{untempered!r}, so the declared distribution (logprob_truncation={spec.logprob_truncation!r}, "
                f"normalised over {'the cut' if low == high else 'every token'}) gives "
                + (f"{want_high!r}" if low == high else f"between {want_low!r} and {want_high!r}")
                + f" (tolerance {tolerance:.2g}).{hint}"
            )
        if spec.logprob_truncation == "renormalised" or cut == "temperature":  # over the seen tokens, conditional
            probs = {t: math.exp(tempered[t] - math.log(kept_total)) for t in kept}
        else:
            probs = {t: math.exp(tempered[t]) / kept_total for t in kept}
        statistic, critical, bins = frequency_test(dict(counts), probs)
        assert statistic <= critical, (
            f"at {sampling} {sum(counts.values())} first tokens do not follow the declared distribution (p^(1/T), "
            f"cut, renormalised) from the engine's records at the default: chi-square {statistic:.1f} over "
            f"{len(bins)} bins > {critical:.1f}. The engine samples at another temperature or cut than it is asked "
            f"(counts {dict(counts.most_common(6))}; base draws {sum(base_counts.values())})"
        )
