"""Engine laws on what a completion is, how two groups' samples relate and what `close` leaves, mixed into
`RolloutEngineContract`.

Why these three: a sampler that keeps decoding finished rows moves a completion's end past its first end-of-sequence
token, so the trainer credits tokens the policy never meant to emit; an engine that derives per-sample seeds as
`seed + i` makes groups seeded s and s + 1 share n - 1 samples, so half a batch's groups are copies; and an engine
closed and used again (a warm replica between runs) that still points at the adapter copies `close` deleted fails, or
serves what it finds there.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pytest

from rl.conformance.law_sizes import LawSizes
from rl.conformance.sampler_fidelity_laws import LOGPROB_TOLERANCE, first_difference
from rl.conformance.support.contract_base import Run, tier
from rl.errors import EngineClosedError
from rl.protocols import RolloutEngine
from rl.seeding import derive_seed
from rl.types import ArtifactRef, Rollout, RolloutRequest

__all__ = ["EngineLifetimeLaws", "coincidence_tail"]

EOS_GROUPS, EOS_N, EOS_MAX_TOKENS = 8, 16, 32
"""The end-of-sequence law's draws: 8 seeded groups of 16, up to 32 tokens each (on the tiny character model, whose
`<eos>` has probability about 1/50 a step, about a fifth of the rows sample a second `<eos>` within 32 tokens); a
declared `LawSizes` draws a share of the groups."""
SEED_PAIRS, SEED_N = 3, 16
"""The seed law's draws: 3 pairs of groups seeded s and s + 1, 16 samples each (a declared `LawSizes`: a share of the
pairs)."""
FALSE_ALARM = 1e-6
"""The chance, over all offsets and pairs together, that independent groups fail the seed law (Bonferroni)."""


def _poisson_binomial_tail(probs: Sequence[float], at_least: int) -> float:
    """P(at least `at_least` of independent events with these probabilities happen)."""
    dist = [1.0]
    for p in probs:
        nxt = [0.0] * (len(dist) + 1)
        for k, mass in enumerate(dist):
            nxt[k] += mass * (1.0 - p)
            nxt[k + 1] += mass * p
        dist = nxt
    return math.fsum(dist[at_least:])


def coincidence_tail(a: Sequence[Rollout], b: Sequence[Rollout]) -> tuple[float, int, int]:
    """The least likely alignment of `b` against `a`: over offsets k, completion i of `b` against completion i + k of
    `a`, the chance that independent draws match as often as these do (a draw of `b` equals `a`'s completion with the
    probability `a` recorded for it, exp of its log-probs' sum). Returns (chance, offset, matches) at the worst
    offset."""
    worst = (1.0, 0, 0)
    for k in range(-(len(b) - 1), len(a)):
        pairs = [(i, i + k) for i in range(len(b)) if 0 <= i + k < len(a)]
        matches = sum(b[i].token_ids == a[j].token_ids for i, j in pairs)
        if matches == 0:
            continue
        probs = [min(1.0, math.exp(math.fsum(a[j].logprobs))) for _, j in pairs]
        tail = _poisson_binomial_tail(probs, matches)
        if tail < worst[0]:
            worst = (tail, k, matches)
    return worst


@tier("engine")
class EngineLifetimeLaws:
    """Needs the `engine`, `rollout_request`, `other_adapter`, `eos_token_id`, `law_sizes` and `rl_run` fixtures of
    `RolloutEngineContract`."""

    def test_engine_completion_ends_at_its_first_end_of_sequence_token(
        self,
        engine: RolloutEngine,
        rollout_request: RolloutRequest,
        eos_token_id: int | None,
        law_sizes: LawSizes,
        rl_run: Run[Any],
    ) -> None:
        """Every completion of 8 groups of 16 (or the declared `LawSizes` share of the groups; up to 32 tokens) ends
        at its first end-of-sequence token: none follows it, none is longer than `max_tokens`, and its log-probs cover
        exactly its tokens (one each; completions that share a prefix record the same log-probs along it). A sampler
        that keeps decoding finished rows and ends a row at its last `<eos>` fails. Without an `eos_token_id` (an
        engine with none) the end is not checked."""
        seen: dict[tuple[int, ...], tuple[float, str]] = {}
        for g in range(law_sizes.groups(EOS_GROUPS)):
            request = replace(
                rollout_request,
                group_id=g,
                n=EOS_N,
                max_tokens=EOS_MAX_TOKENS,
                seed=derive_seed("conformance.engine.eos", rollout_request.seed, g),
            )
            for i, r in enumerate(rl_run(engine.generate(request))):
                where = f"group {g} (seed {request.seed}), completion {i} {r.token_ids}"
                assert len(r.token_ids) <= request.max_tokens, (
                    f"{where} has {len(r.token_ids)} tokens for max_tokens={request.max_tokens}"
                )
                assert len(r.logprobs) == len(r.token_ids), (
                    f"{where} records {len(r.logprobs)} log-probs for {len(r.token_ids)} tokens: the log-probs must "
                    "cover exactly the completion's tokens (cut both at the same end)"
                )
                if eos_token_id is not None and eos_token_id in r.token_ids[:-1]:
                    first = r.token_ids.index(eos_token_id)
                    pytest.fail(
                        f"{where} goes on for {len(r.token_ids) - first - 1} tokens after its first end-of-sequence "
                        f"token {eos_token_id} (position {first}): the sampler kept decoding a finished row and moved "
                        "its end. Stop a row at its first <eos> (keep that token and its log-prob, nothing after)",
                        pytrace=False,
                    )
                for t, lp in enumerate(r.logprobs):
                    prefix = tuple(r.token_ids[: t + 1])
                    earlier, at = seen.setdefault(prefix, (lp, where))
                    assert abs(earlier - lp) <= LOGPROB_TOLERANCE, (
                        f"{where} records log-prob {lp!r} at position {t}, {at} recorded {earlier!r} for the same "
                        "token after the same prefix: the log-probs are not those of the completion's own tokens "
                        "(shifted, or taken from another row)"
                    )

    def test_engine_groups_seeded_apart_share_no_samples(
        self, engine: RolloutEngine, rollout_request: RolloutRequest, law_sizes: LawSizes, rl_run: Run[Any]
    ) -> None:
        """Groups seeded s and s + 1 (same prompt, same adapter) are independent: at no offset do their 16 samples
        coincide more often than independent draws would, at the probabilities the engine recorded (false-alarm chance
        1e-6 over every offset and pair; 3 pairs, or the declared `LawSizes` share). An engine that seeds sample i
        with `seed + i` makes the two groups share 15 samples, one position apart, and fails: give each group seed a
        range of per-sample seeds of its own."""
        pairs = law_sizes.groups(SEED_PAIRS)
        tests = pairs * (2 * SEED_N - 1)
        for p in range(pairs):
            s = derive_seed("conformance.engine.adjacent-seeds", rollout_request.seed, p)
            a, b = (rl_run(engine.generate(replace(rollout_request, group_id=k, n=SEED_N, seed=s + k))) for k in (0, 1))
            tail, offset, matches = coincidence_tail(a, b)
            assert tail * tests >= FALSE_ALARM, (
                f"groups seeded {s} and {s + 1} share {matches} samples at offset {offset} (sample i of one is sample "
                f"i + {offset} of the other), a coincidence of chance {tail:.3g} for independent draws: the two "
                "groups' per-sample seeds overlap (seed + i?). Give each group seed its own range of per-sample seeds "
                "(ours: one generator per group seed; on vLLM, seed * 256 + i)"
            )

    def test_engine_closed_and_used_again_serves_as_before_or_refuses(
        self, engine: RolloutEngine, rollout_request: RolloutRequest, other_adapter: ArtifactRef, rl_run: Run[Any]
    ) -> None:
        """An engine with `close` (a warm replica closes one between runs), closed and then sent the same requests for
        two adapters, returns what it returned before (or refuses each with `rl.errors.EngineClosedError`), and a
        second `close` is harmless. An engine that keeps pointing at the adapter copies `close` deleted fails."""
        close = getattr(engine, "close", None)
        if not callable(close):
            pytest.skip(f"{type(engine).__name__} has no close(), so there is no lifetime past close to check")
        requests = (
            rollout_request,
            replace(rollout_request, group_id=rollout_request.group_id + 1, adapter=other_adapter),
        )
        before = [rl_run(engine.generate(r)) for r in requests]
        _close(close, rl_run)
        for request, earlier in zip(requests, before, strict=True):
            try:
                again = rl_run(engine.generate(request))
            except EngineClosedError:
                continue
            except Exception as exc:
                pytest.fail(
                    f"after close(), the request for adapter {request.adapter.digest[:19]} raised "
                    f"{type(exc).__name__}: {exc}. An engine used after close either serves as before (fetching and "
                    "writing again what close deleted: never a path it removed) or refuses with "
                    "rl.errors.EngineClosedError",
                    pytrace=False,
                )
            difference = first_difference(again, earlier)
            assert difference is None, (
                f"after close(), the request for adapter {request.adapter.digest[:19]} got {difference} it got "
                "before: an engine used after close serves each adapter as before, or refuses with EngineClosedError"
            )
        _close(close, rl_run)
        _close(close, rl_run)


def _close(close: Any, rl_run: Run[Any]) -> None:
    result = close()
    if inspect.isawaitable(result):
        rl_run(result)
