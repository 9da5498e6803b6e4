"""Engines that keep state from one policy version into the next, for the engine-update laws' self-test
(tests/conformance_selftest/test_broken_engine_updates.py): each is the in-memory engine with one bug a real engine
had."""

from __future__ import annotations

import math
import random
from dataclasses import replace

from rl.conformance import Implementation
from rl.conformance.bindings.ours import memory_version0_adapter
from rl.deploy.simulated.artifacts import MemoryArtifacts
from rl.deploy.simulated.grpo_tiers import DIGITS, MemoryEngine, MemoryTrainer, _row, sampling_probs
from rl.types import ArtifactRef, Rollout, RolloutRequest


class DrawingEngine(MemoryEngine):
    """The in-memory engine drawing from `logits(request)` on every call (`MemoryEngine` memoises its draws
    process-wide by adapter digest, which would hide what a broken engine loads)."""

    async def logits(self, request: RolloutRequest) -> list[float]:
        return (await self._table(request.adapter))[_row(request.prompt.question, self.rows)]

    async def generate(self, request: RolloutRequest) -> list[Rollout]:
        group = await super().generate(request)
        probs = sampling_probs(await self.logits(request), request.sampling)  # as MemoryEngine draws
        rng = random.Random(request.seed)
        picks = [rng.choices(range(DIGITS), weights=probs, k=1)[0] for _ in group]
        return [
            replace(r, token_ids=[d], completion=f"####{d}", logprobs=[math.log(probs[d])])
            for r, d in zip(group, picks, strict=True)
        ]


class PrefixCacheEngine(DrawingEngine):
    """Caches a prompt's state (its row's logits) by the prompt alone, from whichever adapter first served it, and
    decodes from that state and the requested adapter's together (their mean): a later version of a served prompt
    samples from neither version's distribution. The cache outlives `close`, as a shared prefix cache does."""

    def __init__(self, artifacts: MemoryArtifacts) -> None:
        super().__init__(artifacts)
        self._prefix: dict[int, list[float]] = {}

    async def logits(self, request: RolloutRequest) -> list[float]:
        current = await super().logits(request)
        cached = self._prefix.setdefault(_row(request.prompt.question, self.rows), list(current))
        return [(a + b) / 2 for a, b in zip(cached, current, strict=True)]


class ResidentWeightsEngine(DrawingEngine):
    """Keeps what it loaded through a pause (`pause`), and after it serves an adapter it never loaded with the
    weights resident before the pause; adapters it loaded before are served as before."""

    pause = "close"

    def __init__(self, artifacts: MemoryArtifacts) -> None:
        super().__init__(artifacts)
        self._resident: list[list[float]] | None = None
        self._paused = False

    async def _table(self, adapter: ArtifactRef) -> list[list[float]]:
        if self._paused and adapter.digest not in self._tables and self._resident is not None:
            return self._resident
        table = await super()._table(adapter)
        self._resident = table
        return table

    def close(self) -> None:
        self._paused = self._paused or self.pause == "close"  # the loaded tables kept


class ResidentAfterWakeEngine(ResidentWeightsEngine):
    """`ResidentWeightsEngine` with vLLM's `sleep` and `wake_up` (huggingface/trl#5312); `close` is correct."""

    pause = "sleep"

    def close(self) -> None:
        MemoryEngine.close(self)

    def sleep(self) -> None:
        self._paused = True

    def wake_up(self) -> None:
        pass


def _impl(name: str, engine: type[MemoryEngine]) -> Implementation:
    return Implementation(name=name, adapter=memory_version0_adapter, engine=engine, trainer=MemoryTrainer)


PREFIX_CACHE = _impl("prefix-cache-by-prompt", PrefixCacheEngine)
RESIDENT_AFTER_CLOSE = _impl("resident-after-close", ResidentWeightsEngine)
RESIDENT_AFTER_WAKE = _impl("resident-after-wake", ResidentAfterWakeEngine)
