"""The durable agentic driver of the agentic tutorial, as plain async code over its tiers (no flyte import).

In production each tier method awaits a Flyte task; on the simulator it is a task of `rl.durable.durable_sim`. The
driver has no checkpoint, state file or resume flag: a retried driver replays its completed actions and resumes at the
first incomplete one, which works only because every action's inputs are the same on every attempt.

Guarantees (each is a test): trials launch concurrently and are judged as each lands; a trial whose task still fails
after its retries is skipped and counted, never fatal to the step; the train step's rewards are canonical (sorted by
trial id) so a replayed step hashes identically. Faults are injected by wrapping the tiers (`rl.agentic.faults`).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from rl.errors import AgenticInputError
from rl.loop.awaiting import results_in_order
from rl.loop.spans import Span, scope
from rl.protocols import AgenticTiers
from rl.types import Reward, Rubric, StepResult, TrialSpec, Weights, WorldRef

T = TypeVar("T")

PROMPT = "find the secret"


@dataclass(frozen=True)
class AgenticConfig:
    """One run's shape (the agentic tutorial's defaults: 3 steps x 3 prompts x 2 samples over 3 worlds), its rubric and
    seed."""

    n_steps: int = 3
    n_worlds: int = 3
    prompts_per_step: int = 3
    n_samples: int = 2
    rubric: Rubric = field(default_factory=Rubric)
    seed: int = 0
    lr: float = 2.0
    max_turns: int = 6

    def validate(self) -> None:
        if self.n_steps < 1 or self.n_worlds < 1 or self.prompts_per_step < 1 or self.n_samples < 1:
            raise AgenticInputError(
                f"n_steps, n_worlds, prompts_per_step and n_samples must all be >= 1; got {self.n_steps}, "
                f"{self.n_worlds}, {self.prompts_per_step}, {self.n_samples}"
            )

    @property
    def trials_per_step(self) -> int:
        return self.prompts_per_step * self.n_samples


@dataclass(frozen=True)
class SkippedTrial:
    """A trial dropped from its step, and why (its generate or its judging failed after every retry)."""

    trial_id: str
    stage: str
    reason: str


@dataclass(frozen=True)
class AgenticOutcome:
    """The driver's result: one `StepResult` per step, the trials it skipped, and the attempt that finished."""

    history: list[StepResult]
    skipped: list[SkippedTrial]
    driver_attempt: int


def world_ids_for(n_worlds: int) -> list[str]:
    return [f"w{i}" for i in range(n_worlds)]


def trial_specs(
    step: int, world_ids: list[str], prompts_per_step: int, n_samples: int, *, seed: int, max_turns: int
) -> list[TrialSpec]:
    """The step's trials, `s<step>-p<prompt>-n<sample>`; prompt p explores world p mod n_worlds."""
    return [
        TrialSpec(
            trial_id=f"s{step}-p{p}-n{s}",
            step=step,
            world_id=world_ids[p % len(world_ids)],
            prompt=PROMPT,
            max_turns=max_turns,
            seed=seed,
        )
        for p in range(prompts_per_step)
        for s in range(n_samples)
    ]


def canonical_rewards(rewards: list[Reward]) -> list[Reward]:
    """Rewards in trial-id order: `as_completed` order differs between attempts; the step's identity must not."""
    return sorted(rewards, key=lambda r: r.trial_id)


async def _landed(key: str, call: Callable[[], Awaitable[T]]) -> tuple[str, T | Exception]:
    """Await one action and hand back (its key, its result or its failure), so `as_completed` can say which landed.

    `call` makes the awaitable only once this task runs, so a task cancelled before it starts leaves nothing unawaited.
    """
    try:
        return key, await call()
    except Exception as exc:  # a task that failed after its retries: the caller skips it
        return key, exc


def _launch(key: str, call: Callable[[], Awaitable[T]]) -> asyncio.Future[tuple[str, T | Exception]]:
    """Start one action now. If the driver dies first, its orphaned failure is retrieved, not logged as lost."""
    future = asyncio.ensure_future(_landed(key, call))
    future.add_done_callback(_retrieve)
    return future


def _retrieve(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


async def run_step(
    tiers: AgenticTiers,
    specs: list[TrialSpec],
    weights: Weights,
    worlds: dict[str, WorldRef],
    rubric: Rubric,
) -> tuple[list[Reward], list[SkippedTrial]]:
    """Generate every trial at once and judge each the moment it lands; returns rewards in landing order."""
    gens = [_launch(sp.trial_id, functools.partial(tiers.generate, sp, weights, worlds[sp.world_id])) for sp in specs]
    skipped: list[SkippedTrial] = []
    judges: list[asyncio.Future[tuple[str, Reward | Exception]]] = []
    for landed in asyncio.as_completed(gens):
        trial_id, traj = await landed
        if isinstance(traj, Exception):
            skipped.append(SkippedTrial(trial_id=trial_id, stage="generate", reason=repr(traj)))
            continue
        judges.append(_launch(trial_id, functools.partial(tiers.verify_and_judge, traj, rubric)))
    rewards: list[Reward] = []
    for trial_id, reward in await results_in_order(judges):
        if isinstance(reward, Exception):
            skipped.append(SkippedTrial(trial_id=trial_id, stage="verify_and_judge", reason=repr(reward)))
        else:
            rewards.append(reward)
    return rewards, skipped


async def run_agentic(config: AgenticConfig, tiers: AgenticTiers, span: Span | None = None) -> AgenticOutcome:
    """The agentic tutorial's `train`: build worlds, attach the trainer, then per step generate → judge → one durable
    train step.

    `span(name)`, when given, is entered around each step's actions (`step-<N>`: its trials, judgments and train
    step), the `flyte.group` role.
    """
    config.validate()
    attempt = tiers.driver_attempt()
    world_ids = world_ids_for(config.n_worlds)
    built = await asyncio.gather(*(tiers.build_world(w, config.seed) for w in world_ids))
    worlds = dict(zip(world_ids, built, strict=True))
    weights = await tiers.setup_trainer(world_ids)

    history: list[StepResult] = []
    skipped: list[SkippedTrial] = []
    for step in range(config.n_steps):
        specs = trial_specs(
            step, world_ids, config.prompts_per_step, config.n_samples, seed=config.seed, max_turns=config.max_turns
        )
        with scope(span, f"step-{step}"):
            rewards, lost = await run_step(tiers, specs, weights, worlds, config.rubric)
            skipped.extend(sorted(lost, key=lambda s: s.trial_id))
            result = await tiers.train_step(step, canonical_rewards(rewards), world_ids, config.lr)
        weights = result.weights
        history.append(result)
    return AgenticOutcome(history=history, skipped=skipped, driver_attempt=attempt)
