"""Deterministic in-memory GRPO tiers: the engine's policy is a small logits table the trainer really updates.

The policy is a table `W[row][digit]` of logits, one row per prompt (prompt "d=" is row d). The engine samples a digit
`a` from softmax(W[row]) and answers "####a"; the trainer takes a clipped-ratio policy-gradient step on the table with
the rollouts' sampling log-probs, so a wrong advantage, a stale sample or a reordered batch changes the bits of the
result. Everything is pure Python floats: the same inputs give bitwise-identical outputs on every machine.

Fault model: these tiers raise nothing on their own; failures, hangs and crashes come from the simulator's FaultPlan.
Latency model: `LatencyModel` draws each call's virtual duration from a digest of its inputs (so a replay agrees).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import math
import pickle
import random
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from rl.algorithm.advantages import group_normalized_advantages
from rl.algorithm.checks import check_staleness
from rl.protocols import Artifacts
from rl.rewards import score
from rl.scoring import SamplingEvaluator
from rl.types import (
    ArtifactRef,
    EvalResult,
    IterationMetrics,
    Prompt,
    Rollout,
    RolloutRequest,
    SamplingSettings,
    StepMetrics,
    TrainBatch,
)
from rl.types import TrainResult as TrainResult

DIGITS = 10


@dataclass(frozen=True)
class LatencyModel:
    """Virtual seconds for one call: `base_s + per_item_s * items`, plus up to `jitter_s` drawn from the call's key."""

    base_s: float = 0.0
    per_item_s: float = 0.0
    jitter_s: float = 0.0

    def seconds(self, items: int, key: object) -> float:
        u = int.from_bytes(hashlib.blake2b(repr(key).encode(), digest_size=8).digest(), "big") / 2**64
        return self.base_s + self.per_item_s * items + self.jitter_s * u


def _row(question: str, rows: int) -> int:
    head = question.rstrip("=").strip()
    if head.isdigit():
        return int(head) % rows
    return int.from_bytes(hashlib.blake2b(question.encode(), digest_size=4).digest(), "big") % rows


def _softmax(logits: Sequence[float]) -> list[float]:
    top = max(logits)
    exps = [math.exp(x - top) for x in logits]
    total = 0.0
    for e in exps:  # left to right, as sum() did before 3.12 compensated it: the same bits on every Python
        total += e
    return [e / total for e in exps]


def sampling_probs(logits: Sequence[float], sampling: SamplingSettings, keep: int | None = None) -> list[float]:
    """The distribution `sampling` draws from (`rl.types.SamplingSettings`, the rule of
    `rl.samplers.decoding.sampling_logprobs`): softmax(logits / T), cut to the top-k and the top-p mass, renormalised
    (cut tokens get 0). `keep` is a token counted in whatever the cut (the trainer's scored token). At the default
    settings exactly `_softmax(logits)`."""
    if sampling.is_default:
        return _softmax(logits)
    scores = [x / sampling.temperature for x in logits]
    kept = [True] * len(scores)
    if 0 < sampling.top_k < len(scores):
        kth = sorted(scores, reverse=True)[sampling.top_k - 1]
        kept = [x >= kth for x in scores]
    if sampling.top_p < 1.0:
        probs = _softmax([x if k else -math.inf for x, k in zip(scores, kept, strict=True)])
        order = sorted(range(len(probs)), key=lambda j: probs[j])  # ascending, stable
        mass = 0.0
        for position, j in enumerate(order):
            mass += probs[j]
            if mass <= 1.0 - sampling.top_p and position < len(order) - 1:
                kept[j] = False
    if keep is not None:
        kept[keep] = True
    return _softmax([x if k else -math.inf for x, k in zip(scores, kept, strict=True)])


def encode_table(table: list[list[float]], **meta: object) -> dict[str, bytes]:
    return {"policy.json": json.dumps({"table": table, **meta}, sort_keys=True, allow_nan=False).encode()}


def decode_table(files: dict[str, bytes]) -> dict[str, Any]:
    return json.loads(files["policy.json"])


_DECODED: dict[bytes, dict[str, Any]] = {}
_DRAWS: dict[tuple[str, int, int, int, SamplingSettings], list[tuple[int, float]]] = {}
_STEPS: dict[tuple[bytes, bytes, bytes, tuple[float, ...]], tuple[dict[str, bytes], dict[str, bytes], StepMetrics]] = {}


def _decoded(files: dict[str, bytes]) -> dict[str, Any]:
    """`decode_table(files)`, shared by every step that reads the same bytes: callers must not mutate it (they copy).

    Replays, reruns and references train from the same adapters again and again; the JSON parse was ~2% of a run.
    """
    blob = files["policy.json"]
    table = _DECODED.get(blob)
    if table is None:
        if len(_DECODED) >= 4096:
            _DECODED.clear()
        table = _DECODED[blob] = decode_table(files)
    return table


class MemoryEngine:
    """RolloutEngine over the logits table stored in the adapter artifact."""

    def __init__(self, artifacts: Artifacts, *, rows: int = DIGITS, latency: LatencyModel = LatencyModel()) -> None:
        self.artifacts, self.rows, self.latency = artifacts, rows, latency
        self.calls = 0
        self._tables: dict[str, list[list[float]]] = {}  # by adapter digest, as a real engine caches LoRA weights

    def close(self) -> None:
        """Forget the loaded tables; the next call loads what it needs again from the store."""
        self._tables.clear()

    async def _table(self, adapter: ArtifactRef) -> list[list[float]]:
        if adapter.digest not in self._tables:
            self._tables[adapter.digest] = decode_table(await self.artifacts.get(adapter))["table"]
        return self._tables[adapter.digest]

    async def generate(self, request: RolloutRequest) -> list[Rollout]:
        self.calls += 1
        table = await self._table(request.adapter)
        row = _row(request.prompt.question, self.rows)
        # Pure in (adapter content, row, seed, n): memoised process-wide as the evaluations are (the adapter digest is
        # a content digest); each call still builds its own rollouts.
        key = (request.adapter.digest, row, request.seed, request.n, request.sampling)
        drawn = _DRAWS.get(key)
        if drawn is None:
            if len(_DRAWS) >= 1 << 14:
                _DRAWS.clear()
            probs = sampling_probs(table[row], request.sampling)
            rng = random.Random(request.seed)
            digits = [rng.choices(range(DIGITS), weights=probs, k=1)[0] for _ in range(request.n)]
            drawn = _DRAWS[key] = [(digit, math.log(probs[digit])) for digit in digits]
        rollouts = []
        for digit, logprob in drawn:
            rollouts.append(
                Rollout(
                    group_id=request.group_id,
                    question=request.prompt.question,
                    answer=request.prompt.answer,
                    completion=f"####{digit}",
                    prompt_token_ids=[row],
                    token_ids=[digit],
                    logprobs=[logprob],
                    policy_version=request.policy_version,
                    seed=request.seed,
                )
            )
        await asyncio.sleep(self.latency.seconds(request.n, (request.seed, request.group_id)))
        return rollouts


@functools.lru_cache(maxsize=1 << 14)
def _score(completion: str, answer: str) -> float:
    """`rl.rewards.score`, pure in its two strings: the in-memory engine's few distinct completions are scored once."""
    return score(completion, answer)


class MemoryScorer:
    """Scorer: the tutorial's reward (`rl.rewards.score`), one call per group."""

    def __init__(self, *, latency: LatencyModel = LatencyModel()) -> None:
        self.latency = latency
        self.calls = 0

    async def score_group(self, rollouts: Sequence[Rollout]) -> list[float]:
        self.calls += 1
        rewards = [_score(r.completion, r.answer) for r in rollouts]
        await asyncio.sleep(self.latency.seconds(len(rollouts), [r.completion for r in rollouts]))
        return rewards


class MemoryTrainer:
    """Trainer: a clipped-ratio policy-gradient step with momentum on the logits table.

    Pure in its inputs (adapter and optimizer state in and out as artifacts), so a replayed step recomputes the same
    bits. Each adapter carries its lineage — (version, step, prompts trained) for every step behind it — so a test can
    prove from the final adapter alone that each iteration was trained exactly once. `executions` counts step calls.
    """

    def __init__(
        self,
        artifacts: Artifacts,
        *,
        rows: int = DIGITS,
        lr: float = 2.0,
        momentum: float = 0.5,
        clip_eps: float = 0.2,
        max_staleness: int = 1,
        latency: LatencyModel = LatencyModel(),
        cold_start_s: float = 0.0,
    ) -> None:
        self.artifacts, self.rows, self.lr, self.momentum = artifacts, rows, lr, momentum
        self.clip_eps, self.max_staleness, self.latency, self.cold_start_s = (
            clip_eps,
            max_staleness,
            latency,
            cold_start_s,
        )
        self.executions: list[int] = []

    async def init_adapter(self, seed: int) -> TrainResult:
        rng = random.Random(seed)
        table = [[rng.uniform(-0.1, 0.1) for _ in range(DIGITS)] for _ in range(self.rows)]
        adapter = await self.artifacts.put(encode_table(table, lineage=[]), name="adapter-v0")
        opt = await self.artifacts.put(encode_table([[0.0] * DIGITS for _ in range(self.rows)]), name="optimizer-v0")
        return TrainResult(adapter=adapter, optimizer_state=opt, policy_version=0, metrics=StepMetrics(0.0, 0, 0))

    async def train_step(self, batch: TrainBatch) -> TrainResult:
        self.executions.append(batch.step)
        policy_files = await self.artifacts.get(batch.adapter)
        if batch.optimizer_state is None:
            raise ValueError("MemoryTrainer.train_step needs the optimizer state that init_adapter returned")
        optimizer_files = await self.artifacts.get(batch.optimizer_state)
        # Pure in (adapter bytes, optimizer bytes, batch, hyper-parameters): chaos repeats each run seed's steps in its
        # reference, every scenario drawn on it, their replays and reruns, so the step is memoised process-wide by
        # exactly those inputs (the pickle keeps every float's bits); a batch that fails its checks is never stored.
        key = (
            policy_files["policy.json"],
            optimizer_files["policy.json"],
            pickle.dumps(
                (batch.rollouts, batch.rewards, batch.step, batch.new_version, batch.sampling), pickle.HIGHEST_PROTOCOL
            ),
            (self.rows, self.lr, self.momentum, self.clip_eps, self.max_staleness),
        )
        step = _STEPS.get(key)
        if step is None:
            if len(_STEPS) >= 2048:
                _STEPS.clear()
            step = _STEPS[key] = self._step(batch, _decoded(policy_files), _decoded(optimizer_files))
        adapter_files, optimizer_out, metrics = step
        await asyncio.sleep(self.cold_start_s + self.latency.seconds(len(batch.rollouts), batch.step))
        adapter = await self.artifacts.put(dict(adapter_files), name=f"adapter-v{batch.new_version}")
        opt = await self.artifacts.put(dict(optimizer_out), name=f"optimizer-v{batch.new_version}")
        return TrainResult(adapter=adapter, optimizer_state=opt, policy_version=batch.new_version, metrics=metrics)

    def _step(
        self, batch: TrainBatch, policy: dict[str, Any], optimizer: dict[str, Any]
    ) -> tuple[dict[str, bytes], dict[str, bytes], StepMetrics]:
        """One step's arithmetic: the new adapter's and optimizer's files, and the step's metrics."""
        table: list[list[float]] = [list(r) for r in policy["table"]]
        lineage: list[object] = list(policy["lineage"])
        velocity: list[list[float]] = [list(r) for r in optimizer["table"]]
        trained_version = batch.new_version - 1
        staleness = [
            check_staleness(i, r.policy_version, trained_version, self.max_staleness, f"step {batch.step}: ")
            for i, r in enumerate(batch.rollouts)
        ]
        advantages = group_normalized_advantages([r.group_id for r in batch.rollouts], batch.rewards)
        grad = [[0.0] * DIGITS for _ in range(self.rows)]
        contributing = skipped = clipped = 0
        loss = 0.0
        for rollout, adv in zip(batch.rollouts, advantages, strict=True):
            if adv == 0.0:
                skipped += 1
                continue
            contributing += 1
            row, digit = rollout.prompt_token_ids[0], rollout.token_ids[0]
            probs = sampling_probs(table[row], batch.sampling, keep=digit)
            ratio = math.exp(math.log(probs[digit]) - rollout.logprobs[0])
            loss -= min(ratio * adv, max(min(ratio, 1 + self.clip_eps), 1 - self.clip_eps) * adv)
            if (adv > 0 and ratio > 1 + self.clip_eps) or (adv < 0 and ratio < 1 - self.clip_eps):
                clipped += 1  # the clipped branch is flat: no gradient
                continue
            # d log q(digit) / d W[row][j] = (1[j = digit] - q_j) / T; a cut token (q_j = 0) gets none of it.
            scale = adv * ratio if batch.sampling.temperature == 1.0 else adv * ratio / batch.sampling.temperature
            for j in range(DIGITS):
                grad[row][j] += scale * ((1.0 if j == digit else 0.0) - probs[j])
        if contributing:
            for row in range(self.rows):
                for j in range(DIGITS):
                    velocity[row][j] = self.momentum * velocity[row][j] + grad[row][j] / contributing
                    table[row][j] += self.lr * velocity[row][j]
        prompts = sorted({r.question for r in batch.rollouts})
        lineage.append({"version": batch.new_version, "step": batch.step, "prompts": prompts})
        metrics = StepMetrics(
            loss=loss / contributing if contributing else 0.0,
            contributing=contributing,
            skipped_zero_advantage=skipped,
            clip_frac=clipped / contributing if contributing else 0.0,
            max_staleness=max(staleness, default=0),
        )
        return encode_table(table, lineage=lineage), encode_table(velocity), metrics


T = TypeVar("T")
_EVALUATIONS: dict[tuple[object, ...], EvalResult] = {}


def _without_yielding(coro: Coroutine[Any, Any, T]) -> T:
    """`coro`'s result, run here and now; it may only yield bare (`asyncio.sleep(0)`), never wait on a future."""
    try:
        while True:
            if coro.send(None) is not None:
                coro.close()
                raise RuntimeError("a latency-free tier awaited a future: it cannot be run without the loop")
    except StopIteration as done:
        return done.value


class MemoryEvaluator(SamplingEvaluator):
    """Evaluator: the real `SamplingEvaluator` over a latency-free MemoryEngine, taking `latency` virtual seconds."""

    def __init__(self, artifacts: Artifacts, prompts: Sequence[Prompt], *, latency: LatencyModel = LatencyModel()):
        super().__init__(MemoryEngine(artifacts), prompts)
        self.latency = latency
        self.calls = 0

    async def evaluate(self, adapter: ArtifactRef, policy_version: int, k: int, seed: int) -> EvalResult:
        self.calls += 1
        # Pure in (adapter content, version, k, seed, prompts): chaos reruns the same evaluations thousands of times,
        # so the result is memoised process-wide (the adapter digest is a content digest, so a hit is the same value).
        key = (
            adapter.digest,
            policy_version,
            k,
            seed,
            self.max_tokens,
            tuple((p.question, p.answer) for p in self.prompts),
        )
        result = _EVALUATIONS.get(key)
        if result is None:
            if len(_EVALUATIONS) >= 4096:
                _EVALUATIONS.clear()
            # Run to its end without yielding to the loop, so a miss takes the same loop turns as a hit: the first
            # scenario in a process had otherwise another interleaving than the same seed run later.
            result = _EVALUATIONS[key] = _without_yielding(super().evaluate(adapter, policy_version, k, seed))
        await asyncio.sleep(self.latency.seconds(len(self.prompts) * k, (policy_version, seed)))
        return result


class RecordingReporter:
    """Reporter that keeps every publication, for tests that check what a user would have seen."""

    def __init__(self) -> None:
        self.publications: list[tuple[int, str]] = []
        self.last: list[IterationMetrics] = []

    async def publish(
        self, history: Sequence[IterationMetrics], *, status: str, evals: Sequence[EvalResult] = ()
    ) -> None:
        self.publications.append((len(history), status))
        self.last = list(history)
