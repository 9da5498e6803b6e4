"""Broken rollout engines and trainers, each a bug a fork really ships; the suite must fail each on the right law."""

from __future__ import annotations

import asyncio
import functools
import itertools
import math
import random
import struct
import tempfile
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from rl.algorithm.advantages import group_normalized_advantages
from rl.conformance import AlgorithmSpec, Implementation, LawSizes
from rl.conformance.bindings.ours import IN_MEMORY, memory_version0_adapter
from rl.deploy.simulated.artifacts import MemoryArtifacts
from rl.deploy.simulated.grpo_tiers import (
    DIGITS,
    MemoryEngine,
    MemoryTrainer,
    _decoded,
    _row,
    _softmax,
    decode_table,
    encode_table,
)
from rl.storage.checkpoint.memory_store import MemoryCheckpointStore
from rl.types import ArtifactRef, Rollout, RolloutRequest, TrainBatch, TrainResult


class UnseededEngine(MemoryEngine):
    """Draws from one process-wide stream instead of the request's seed (it only labels rollouts with it): a retried
    request samples a different group."""

    _draws = itertools.count(1)

    async def generate(self, request: RolloutRequest) -> list[Rollout]:
        group = await super().generate(replace(request, seed=next(self._draws)))
        return [replace(r, seed=request.seed) for r in group]


class StaleAdapterEngine(MemoryEngine):
    """Caches the loaded adapter by its policy-version label: a new adapter under a reused label is never loaded."""

    def __init__(self, artifacts: MemoryArtifacts) -> None:
        super().__init__(artifacts)
        self._by_label: dict[int, ArtifactRef] = {}

    async def generate(self, request: RolloutRequest) -> list[Rollout]:
        adapter = self._by_label.setdefault(request.policy_version, request.adapter)
        return await super().generate(replace(request, adapter=adapter))


class TopKEngine(MemoryEngine):
    """Samples from the three most probable tokens only (a top-k applied to sampling) but records the full
    distribution's log-probs: the importance ratio's denominator is not the probability the token was drawn with."""

    async def generate(self, request: RolloutRequest) -> list[Rollout]:
        group = await super().generate(request)
        table = await self._table(request.adapter)
        logits = table[_row(request.prompt.question, self.rows)]
        top = sorted(range(len(logits)), key=lambda d: -logits[d])[:3]
        rng = random.Random(request.seed)
        picks = [rng.choice(top) for _ in group]
        return [
            replace(r, token_ids=[d], completion=f"####{d}", logprobs=[math.log(_softmax(logits)[d])])
            for r, d in zip(group, picks, strict=True)
        ]


class AdapterBlindBatchEngine(MemoryEngine):
    """Batches one call's requests and samples each distinct (prompt, seed, n, max_tokens) once, from the first
    request's adapter: a batching dedupe keyed without the adapter. Single requests are right."""

    async def generate_groups(self, requests: Sequence[RolloutRequest]) -> list[list[Rollout]]:
        done: dict[tuple[object, ...], list[Rollout]] = {}
        out = []
        for request in requests:
            key = (request.prompt.question, request.seed, request.n, request.max_tokens)
            if key not in done:
                done[key] = await self.generate(request)
            out.append([replace(r, group_id=request.group_id) for r in done[key]])
        return out


class KeepsDecodingEngine(MemoryEngine):
    """The in-memory engine with an end-of-sequence token (10) that keeps decoding a row after it: each completion is
    the digit, `<eos>`, then another digit and `<eos>` (cut at `max_tokens`), so the row ends at its last `<eos>`, not
    its first. Every token records the log-prob it was drawn with."""

    eos_token_id = DIGITS
    EOS_LOGPROB = math.log(0.5)

    async def generate(self, request: RolloutRequest) -> list[Rollout]:
        group = await super().generate(request)
        probs = _softmax((await self._table(request.adapter))[_row(request.prompt.question, self.rows)])
        rng = random.Random(f"keeps-decoding-{request.seed}")
        out = []
        for r in group:
            more = rng.choices(range(DIGITS), weights=probs, k=1)[0]
            tokens = [*r.token_ids, DIGITS, more, DIGITS][: request.max_tokens]
            logps = [*r.logprobs, self.EOS_LOGPROB, math.log(probs[more]), self.EOS_LOGPROB][: request.max_tokens]
            out.append(replace(r, token_ids=tokens, logprobs=logps))
        return out


class SeedPlusIndexEngine(MemoryEngine):
    """Draws sample i of a group seeded s with its own stream seeded s + i (vLLM's per-sample seeds, used as they are):
    the groups seeded s and s + 1 share all samples but one, one position apart."""

    async def generate(self, request: RolloutRequest) -> list[Rollout]:
        samples = []
        for i in range(request.n):
            (one,) = await super().generate(replace(request, n=1, seed=request.seed + i))
            samples.append(replace(one, seed=request.seed))
        return samples


class DeletedPathEngine(MemoryEngine):
    """Copies each adapter to a directory of its own and reads it from there, keyed by digest; `close` deletes the
    directory but keeps the paths, so the engine used again reads adapters from files it deleted."""

    def __init__(self, artifacts: MemoryArtifacts) -> None:
        super().__init__(artifacts)
        self._root: tempfile.TemporaryDirectory[str] | None = None
        self._paths: dict[str, Path] = {}

    async def _table(self, adapter: ArtifactRef) -> list[list[float]]:
        path = self._paths.get(adapter.digest)
        if path is None:
            if self._root is None:
                self._root = tempfile.TemporaryDirectory(prefix="rl-selftest-engine-")
            path = Path(self._root.name) / adapter.digest.replace(":", "-")
            path.write_bytes((await self.artifacts.get(adapter))["policy.json"])
            self._paths[adapter.digest] = path
        return list(decode_table({"policy.json": path.read_bytes()})["table"])

    def close(self) -> None:
        root, self._root = self._root, None
        if root is not None:
            root.cleanup()


class FreshOptimizerTrainer(MemoryTrainer):
    """Builds a fresh optimizer state for every step instead of continuing from the batch's: momentum is lost."""

    async def train_step(self, batch: TrainBatch) -> TrainResult:
        fresh = (await self.init_adapter(0)).optimizer_state
        return await super().train_step(replace(batch, optimizer_state=fresh))


class LossyRestoreTrainer(MemoryTrainer):
    """Saves the optimizer state rounded to float32 (half the bytes) but keeps the exact state in memory for the step
    that continues it: correct while the process lives, another run after any restore."""

    def __init__(self, artifacts: MemoryArtifacts) -> None:
        super().__init__(artifacts)
        self._exact: dict[str, ArtifactRef] = {}

    async def train_step(self, batch: TrainBatch) -> TrainResult:
        if batch.optimizer_state is not None and batch.optimizer_state.digest in self._exact:
            batch = replace(batch, optimizer_state=self._exact[batch.optimizer_state.digest])
        result = await super().train_step(batch)
        state = _decoded(await self.artifacts.get(result.optimizer_state))
        rounded = [[struct.unpack("f", struct.pack("f", v))[0] for v in row] for row in state["table"]]
        saved = await self.artifacts.put(encode_table(rounded), name=f"optimizer-v{batch.new_version}-f32")
        self._exact[saved.digest] = result.optimizer_state
        return replace(result, optimizer_state=saved)


class UnboundedStalenessTrainer(MemoryTrainer):
    """Trains any batch, however stale: its staleness bound is effectively off."""

    def __init__(self, artifacts: MemoryArtifacts) -> None:
        super().__init__(artifacts, max_staleness=10**9)

    async def train_step(self, batch: TrainBatch) -> TrainResult:
        # Newer-than-trained rollouts too: relabelled as on-policy before the (now toothless) check.
        trained = batch.new_version - 1
        rollouts = [replace(r, policy_version=min(r.policy_version, trained)) for r in batch.rollouts]
        return await super().train_step(replace(batch, rollouts=rollouts))


def _impl(name: str, **tiers: object) -> Implementation:
    # IN_MEMORY's capabilities: MemoryTrainer's step has no KL penalty.
    return Implementation(name=name, adapter=memory_version0_adapter, capabilities=IN_MEMORY.capabilities, **tiers)  # type: ignore[arg-type]


UNSEEDED_ENGINE = _impl("unseeded-engine", engine=UnseededEngine, trainer=MemoryTrainer)
STALE_ADAPTER_ENGINE = _impl("stale-adapter-engine", engine=StaleAdapterEngine, trainer=MemoryTrainer)
TOP_K_ENGINE = _impl("top-k-engine", engine=TopKEngine, trainer=MemoryTrainer)
KEEPS_DECODING_ENGINE = _impl("keeps-decoding-engine", engine=KeepsDecodingEngine, trainer=MemoryTrainer)
SEED_PLUS_INDEX_ENGINE = _impl("seed-plus-index-engine", engine=SeedPlusIndexEngine, trainer=MemoryTrainer)
DELETED_PATH_ENGINE = _impl("deleted-path-engine", engine=DeletedPathEngine, trainer=MemoryTrainer)
ADAPTER_BLIND_BATCH_ENGINE = _impl("adapter-blind-batch-engine", engine=AdapterBlindBatchEngine, trainer=MemoryTrainer)
LOSSY_RESTORE_TRAINER = _impl("lossy-restore-trainer", engine=MemoryEngine, trainer=LossyRestoreTrainer)
UNBOUNDED_STALENESS_TRAINER = _impl(
    "unbounded-staleness-trainer", engine=MemoryEngine, trainer=UnboundedStalenessTrainer
)
TRAINER_NOT_AS_DECLARED = Implementation(
    name="trainer-not-as-declared",
    adapter=memory_version0_adapter,
    engine=MemoryEngine,
    trainer=MemoryTrainer,
    capabilities=IN_MEMORY.capabilities,
    # The advantages it binds went Dr. GRPO (no std) and so did its declaration; its trainer still divides by the std.
    advantages=functools.partial(group_normalized_advantages, scale="none"),
    algorithm=AlgorithmSpec(advantage_scale="none"),
)
FRESH_OPTIMIZER_TRAINER = _impl("fresh-optimizer-trainer", engine=MemoryEngine, trainer=FreshOptimizerTrainer)

# The sampling laws' three bugs again, declaring REAL_LM's sizes: an eighth of each law's groups still catches each.
AN_EIGHTH = LawSizes(draw_fraction=1 / 8)
TOP_K_ENGINE_AT_AN_EIGHTH = replace(TOP_K_ENGINE, name="top-k-engine-at-an-eighth", sizes=AN_EIGHTH)
KEEPS_DECODING_ENGINE_AT_AN_EIGHTH = replace(
    KEEPS_DECODING_ENGINE, name="keeps-decoding-engine-at-an-eighth", sizes=AN_EIGHTH
)
SEED_PLUS_INDEX_ENGINE_AT_AN_EIGHTH = replace(
    SEED_PLUS_INDEX_ENGINE, name="seed-plus-index-engine-at-an-eighth", sizes=AN_EIGHTH
)


class InPlaceCheckpointStore(MemoryCheckpointStore):
    """Writes the checkpoint in place, a chunk per await (an async file write without write-aside-and-rename): a
    driver killed mid-save leaves a truncated checkpoint."""

    async def save(self, data: bytes) -> None:
        self.data = b""
        for start in range(0, len(data), 1024):
            self.data += data[start : start + 1024]
            await asyncio.sleep(0)


IN_PLACE_CHECKPOINT_STORE = Implementation(name="in-place-state-store", state_store=InPlaceCheckpointStore)
