"""Broken GRPO drivers, each our driver with one real bug; the suite must fail each on the right law.

The resume bugs are written as the checkpoint a buggy driver saves (decoded, edited, re-encoded with a valid digest),
so the checkpoint verifies and only the laws about resuming can tell.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import replace
from unittest import mock

import rl.loop.grpo as grpo
from fakes.conformance_impl import FAKES
from rl.conformance import Implementation
from rl.loop.checkpoint import DriverState, decode_state, encode_state
from rl.loop.grpo import GrpoConfig, GrpoOutcome, GrpoTiers, run_grpo
from rl.protocols import StateStore
from rl.seeding import derive_seed
from rl.types import RolloutRequest


class _SavesEdited:
    """The driver's checkpoint store, except every saved state first goes through `edit` (the bug)."""

    def __init__(self, inner: StateStore, edit: Callable[[DriverState], DriverState]) -> None:
        self.inner, self.edit = inner, edit

    async def save(self, data: bytes) -> None:
        await self.inner.save(encode_state(self.edit(decode_state(data))))

    async def load(self) -> bytes | None:
        return await self.inner.load()


def _saving(edit: Callable[[DriverState], DriverState]):  # type: ignore[no-untyped-def]
    async def driver(config: GrpoConfig, tiers: GrpoTiers, store: StateStore) -> GrpoOutcome:
        return await run_grpo(config, tiers, _SavesEdited(store, edit))

    return driver


async def _in_finish_order(config, tiers, iteration, adapter, version):  # type: ignore[no-untyped-def]
    """Seed 002's bug in GRPO: each group's rollouts and rewards appended in the order the groups finish."""
    prompts = grpo.sample_prompts(config, tiers.prompts.train_prompts(), iteration)
    requests = [
        RolloutRequest(gid, p, config.group_size, adapter, version, grpo.rollout_seed(config.seed, iteration, gid))
        for gid, p in enumerate(prompts)
    ]
    rollouts, rewards = [], []
    for finished in asyncio.as_completed([tiers.engine.generate(r) for r in requests]):
        group = await finished
        rollouts.extend(group)
        rewards.extend(await tiers.scorer.score_group(group))
    return rollouts, rewards


async def finish_order_driver(config: GrpoConfig, tiers: GrpoTiers, store: StateStore) -> GrpoOutcome:
    with mock.patch.object(grpo, "generate_and_score", _in_finish_order):
        return await run_grpo(config, tiers, store)


class _ReseededEngine:
    """What a driver change that derives rollout seeds differently sends: same groups, new action identities."""

    def __init__(self, inner) -> None:  # type: ignore[no-untyped-def]
        self.inner = inner

    async def generate(self, request: RolloutRequest):  # type: ignore[no-untyped-def]
        return await self.inner.generate(replace(request, seed=derive_seed("v2-rollouts", request.seed)))


async def reseeding_driver(config: GrpoConfig, tiers: GrpoTiers, store: StateStore) -> GrpoOutcome:
    """A new release that seeds rollouts another way: a correct loop on its own, but runs recorded by the previous
    release re-execute every generation after an upgrade."""
    return await run_grpo(config, replace(tiers, engine=_ReseededEngine(tiers.engine)), store)


def _driver(name: str, driver) -> Implementation:  # type: ignore[no-untyped-def]
    return replace(FAKES, name=name, driver=driver)


HISTORY_DROPPED = _driver("history-dropped-on-resume", _saving(lambda s: replace(s, history=[])))
PROMPT_SKIPPED = _driver("iteration-skipped-on-resume", _saving(lambda s: replace(s, iteration=s.iteration + 1)))
STEP_TWICE = _driver(
    "iteration-retrained-on-resume", _saving(lambda s: replace(s, iteration=s.iteration - 1) if s.iteration >= 0 else s)
)
FINISH_ORDER = _driver("rewards-in-finish-order", finish_order_driver)
RESEEDED = _driver("reseeded-rollouts", reseeding_driver)
