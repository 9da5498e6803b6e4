"""Broken GRPO drivers, each our driver with one real bug; the suite must fail each on the right law.

The resume bugs are written as the checkpoint a buggy driver saves (decoded, edited, re-encoded with a valid digest),
so the checkpoint verifies and only the laws about resuming can tell.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import replace
from typing import Any
from unittest import mock

import rl.loop.grpo as grpo
import rl.storage.checkpoint.format as checkpoint_format
import rl.storage.checkpoint.resume as resume
from rl.conformance import Implementation
from rl.conformance.bindings.ours import IN_MEMORY
from rl.errors import CheckpointCorruptError
from rl.identity import content_digest
from rl.loop.grpo import GrpoConfig, GrpoOutcome, GrpoTiers, run_grpo
from rl.loop.phase_timing import Scored
from rl.protocols import CheckpointStore
from rl.seeding import derive_seed
from rl.storage.checkpoint.format import DriverState, decode_state, encode_state
from rl.types import RolloutRequest


class _SavesEdited:
    """The driver's checkpoint store, except every saved state first goes through `edit` (the bug)."""

    def __init__(self, inner: CheckpointStore, edit: Callable[[DriverState], DriverState]) -> None:
        self.inner, self.edit = inner, edit

    async def save(self, data: bytes) -> None:
        await self.inner.save(encode_state(self.edit(decode_state(data))))

    async def load(self) -> bytes | None:
        return await self.inner.load()


def _saving(edit: Callable[[DriverState], DriverState]):  # type: ignore[no-untyped-def]
    async def driver(config: GrpoConfig, tiers: GrpoTiers, store: CheckpointStore) -> GrpoOutcome:
        return await run_grpo(config, tiers, _SavesEdited(store, edit))

    return driver


async def _in_finish_order(config, tiers, iteration, adapter, version):  # type: ignore[no-untyped-def]
    """The agentic tutorial's bug in GRPO: each group's rollouts and rewards appended in the order the groups finish."""
    prompts = grpo.sample_prompts(config, tiers.prompts.train_prompts(), iteration)
    requests = [
        RolloutRequest(gid, p, config.group_size, adapter, version, grpo.rollout_seed(config.seed, iteration, gid))
        for gid, p in enumerate(prompts)
    ]
    rollouts, rewards = [], []
    for finished in asyncio.as_completed([tiers.engine.generate(r) for r in requests]):
        group = await finished
        group_rewards = await tiers.scorer.score_group(group)
        grpo.refuse_non_finite(iteration, group, group_rewards)
        rollouts.extend(group)
        rewards.extend(group_rewards)
    return Scored(rollouts, rewards, {})  # untimed: no law reads the phase seconds


async def finish_order_driver(config: GrpoConfig, tiers: GrpoTiers, store: CheckpointStore) -> GrpoOutcome:
    with mock.patch.object(grpo, "generate_and_score", _in_finish_order):
        return await run_grpo(config, tiers, store)


class _ReseededEngine:
    """What a driver change that derives rollout seeds differently sends: same groups, new action identities."""

    def __init__(self, inner) -> None:  # type: ignore[no-untyped-def]
        self.inner = inner

    async def generate(self, request: RolloutRequest):  # type: ignore[no-untyped-def]
        return await self.inner.generate(replace(request, seed=derive_seed("v2-rollouts", request.seed)))


async def reseeding_driver(config: GrpoConfig, tiers: GrpoTiers, store: CheckpointStore) -> GrpoOutcome:
    """A new release that seeds rollouts another way: a correct loop on its own, but runs recorded by the previous
    release re-execute every generation after an upgrade."""
    return await run_grpo(config, replace(tiers, engine=_ReseededEngine(tiers.engine)), store)


def _patched(target: object, name: str, replacement):  # type: ignore[no-untyped-def]
    """Our driver with one module-level function of the loop replaced by a buggy one, for the call's duration."""

    async def driver(config: GrpoConfig, tiers: GrpoTiers, store: CheckpointStore) -> GrpoOutcome:
        with mock.patch.object(target, name, replacement):
            return await run_grpo(config, tiers, store)

    return driver


async def _restart_on_corrupt(store, config, artifacts):  # type: ignore[no-untyped-def]
    """Treats a checkpoint it cannot parse as no checkpoint: a torn write silently restarts the run from scratch."""
    try:
        return await resume.load_state(store, config, artifacts)
    except CheckpointCorruptError:
        return None


def _any_schema(blob: bytes, *where: str) -> DriverState:
    """Reads a checkpoint of any schema version as its own (the version tag is never compared)."""
    try:
        doc = json.loads(blob)
    except ValueError:
        return decode_state(blob, *where)
    if isinstance(doc, dict) and "schema" in doc:
        doc["schema"] = checkpoint_format.SCHEMA_VERSION
    return decode_state(json.dumps(doc).encode(), *where)


def _digest_unchecked(blob: bytes, *where: str) -> DriverState:
    """Reads a checkpoint without comparing its digest to its contents: an altered write is resumed."""
    try:
        doc = json.loads(blob)
    except ValueError:
        return decode_state(blob, *where)
    if isinstance(doc, dict) and isinstance(doc.get("state"), dict):
        doc["digest"] = content_digest(doc["state"])
    return decode_state(json.dumps(doc).encode(), *where)


class _TheCheckpointsConfig:
    def __init__(self, digest: str) -> None:
        self._digest = digest

    def digest(self) -> str:
        return self._digest


async def _config_unchecked(store, config, artifacts):  # type: ignore[no-untyped-def]
    """Resumes whatever checkpoint it finds, whichever configuration wrote it."""
    blob = await store.load()
    if blob is None:
        return None
    return await resume.load_state(store, _TheCheckpointsConfig(decode_state(blob).config_digest), artifacts)


class _EverythingExists:
    def __init__(self, inner) -> None:  # type: ignore[no-untyped-def]
        self.inner = inner

    async def exists(self, ref) -> bool:  # type: ignore[no-untyped-def]
        return True


async def _artifacts_unchecked(store, config, artifacts):  # type: ignore[no-untyped-def]
    """Resumes without asking the artifact store whether the checkpoint's adapter is still there."""
    return await resume.load_state(store, config, _EverythingExists(artifacts))


class _OnlyFirstChecked:
    """Answers the first `exists` truthfully and every later one with yes: the resume checks the adapter only."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.asked = inner, 0

    async def exists(self, ref: Any) -> bool:
        self.asked += 1
        return await self.inner.exists(ref) if self.asked == 1 else True


async def _adapter_only_checked(store, config, artifacts):  # type: ignore[no-untyped-def]
    """Resumes having asked the artifact store about the checkpoint's adapter, never its optimizer state."""
    return await resume.load_state(store, config, _OnlyFirstChecked(artifacts))


def _nan_only(iteration, group, rewards):  # type: ignore[no-untyped-def]
    """Checks rewards with `x != x`: NaN is caught, an infinity is trained on."""
    if any(r != r for r in rewards):
        _refuse_non_finite(iteration, group, rewards)


async def _row_twice(config, tiers, state, iteration, scored):  # type: ignore[no-untyped-def]
    """Records the iteration's metrics row when the step lands and again when it commits: two rows per iteration."""
    trained = await _train(config, tiers, state, iteration, scored)
    return replace(trained, history=[*trained.history, trained.history[-1]])


_train, _refuse_non_finite = grpo._train, grpo.refuse_non_finite


def _driver(name: str, driver) -> Implementation:  # type: ignore[no-untyped-def]
    return replace(IN_MEMORY, name=name, driver=driver)


HISTORY_DROPPED = _driver("history-dropped-on-resume", _saving(lambda s: replace(s, history=[])))
PROMPT_SKIPPED = _driver("iteration-skipped-on-resume", _saving(lambda s: replace(s, iteration=s.iteration + 1)))
STEP_TWICE = _driver(
    "iteration-retrained-on-resume", _saving(lambda s: replace(s, iteration=s.iteration - 1) if s.iteration >= 0 else s)
)
FINISH_ORDER = _driver("rewards-in-finish-order", finish_order_driver)
RESEEDED = _driver("reseeded-rollouts", reseeding_driver)
TORN_RESTARTS = _driver("restarts-on-a-torn-checkpoint", _patched(grpo, "load_state", _restart_on_corrupt))
DIGEST_UNCHECKED = _driver("resumes-an-altered-checkpoint", _patched(resume, "decode_state", _digest_unchecked))
ANY_SCHEMA = _driver("reads-any-schema-version", _patched(resume, "decode_state", _any_schema))
CONFIG_UNCHECKED = _driver("resumes-another-configuration", _patched(grpo, "load_state", _config_unchecked))
ADAPTER_UNCHECKED = _driver("resumes-a-lost-adapter", _patched(grpo, "load_state", _artifacts_unchecked))
OPTIMIZER_UNCHECKED = _driver("resumes-a-lost-optimizer-state", _patched(grpo, "load_state", _adapter_only_checked))
NAN_ONLY = _driver("infinite-reward-trained", _patched(grpo, "refuse_non_finite", _nan_only))
ROW_TWICE = _driver("history-row-twice", _patched(grpo, "_train", _row_twice))
