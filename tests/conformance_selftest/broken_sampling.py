"""Broken engines, trainers and log-prob functions at a temperature or a top-k/top-p cut, each a bug a library shipped;
the sampling and behaviour-policy laws must fail each."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from rl.conformance import AlgorithmSpec, Implementation
from rl.conformance.bindings.ours import memory_version0_adapter
from rl.deploy.simulated.grpo_tiers import MemoryEngine, MemoryTrainer, _row, _softmax, sampling_probs
from rl.types import DEFAULT_SAMPLING, Rollout, RolloutRequest, SamplingSettings, TrainBatch, TrainResult


class UntemperedRecordsEngine(MemoryEngine):
    """Samples at the request's temperature and cut, but records each token's log-prob under softmax(logits): vLLM's
    raw log-probs, reported before the temperature (TRL #4159)."""

    async def generate(self, request: RolloutRequest) -> list[Rollout]:
        group = await super().generate(request)
        probs = _softmax((await self._table(request.adapter))[_row(request.prompt.question, self.rows)])
        return [replace(r, logprobs=[math.log(probs[r.token_ids[0]])]) for r in group]


class UntemperedTrainer(MemoryTrainer):
    """Scores the batch's tokens at temperature 1 with no cut, whatever the batch was sampled at (TRL before PR
    #3029: `_get_per_token_logps` without the temperature)."""

    def __init__(self, artifacts: Any) -> None:
        super().__init__(artifacts, max_staleness=2)

    async def train_step(self, batch: TrainBatch) -> TrainResult:
        return await super().train_step(replace(batch, sampling=DEFAULT_SAMPLING))


class RecomputingTrainer(MemoryTrainer):
    """Replaces a stale rollout's recorded log-probs with the trained adapter's own (the old log-probs recomputed by
    the current policy): every stale ratio is then 1, and the recorded behaviour policy is silently dropped."""

    def __init__(self, artifacts: Any) -> None:
        super().__init__(artifacts, max_staleness=2)

    async def train_step(self, batch: TrainBatch) -> TrainResult:
        table = (await MemoryEngine(self.artifacts)._table(batch.adapter)) if batch.rollouts else []
        trained = batch.new_version - 1
        rollouts = [
            r
            if r.policy_version == trained
            else replace(
                r,
                logprobs=[
                    math.log(
                        sampling_probs(table[r.prompt_token_ids[0]], batch.sampling, keep=r.token_ids[0])[
                            r.token_ids[0]
                        ]
                    )
                ],
            )
            for r in batch.rollouts
        ]
        return await super().train_step(replace(batch, rollouts=rollouts))


def untempered_token_logprobs(model: Any, prompts: Any, completions: Any, sampling: Any) -> Any:
    """Our batched teacher forcing with the sampling settings dropped: log softmax(logits), TRL 0.15's."""
    from rl.samplers.decoding import batched_teacher_forced_logprobs

    return batched_teacher_forced_logprobs(model, prompts, completions, 0)[0]


def uncut_token_logprobs(model: Any, prompts: Any, completions: Any, sampling: Any) -> Any:
    """A correct choice, TRL 0.16's: log softmax(logits / T) over every token, the top-k/top-p cut ignored."""
    from rl.samplers.decoding import batched_teacher_forced_logprobs

    tempered = SamplingSettings(temperature=sampling.temperature)
    return batched_teacher_forced_logprobs(model, prompts, completions, 0, tempered)[0]


def _impl(name: str, **tiers: Any) -> Implementation:
    return Implementation(name=name, adapter=memory_version0_adapter, **tiers)


UNTEMPERED_RECORDS_ENGINE = _impl("untempered-records-engine", engine=UntemperedRecordsEngine)
UNTEMPERED_TRAINER = _impl("untempered-trainer", engine=MemoryEngine, trainer=UntemperedTrainer)
RECOMPUTING_TRAINER = _impl("recomputing-trainer", engine=MemoryEngine, trainer=RecomputingTrainer)
UNTEMPERED_TOKEN_LOGPROBS = Implementation(name="untempered-token-logprobs", token_logprobs=untempered_token_logprobs)
# The same correct function, declared (passes every case) and undeclared (fails the two cuts, naming the declaration).
IGNORED_TRUNCATION = Implementation(
    name="ignored-truncation",
    token_logprobs=uncut_token_logprobs,
    algorithm=AlgorithmSpec(logprob_truncation="ignored"),
)
UNDECLARED_IGNORED_TRUNCATION = Implementation(
    name="undeclared-ignored-truncation", token_logprobs=uncut_token_logprobs
)
DECLARED = {"IGNORED_TRUNCATION": IGNORED_TRUNCATION}
"""Correct implementations here whose declaration differs from ours (test_declared_algorithm counts them)."""
