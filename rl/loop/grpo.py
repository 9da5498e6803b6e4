"""The GRPO driver of the training-loop tutorial: sequential and pipelined, checkpointed, with evaluation off the
critical path.

Plain async code over the tier protocols (no flyte import): in production each tier method awaits a Flyte task, in
tests it is an in-memory tier on the durable simulator. The driver owns ordering, identity and resume; the tiers own
the work.

Guarantees (each is a test): train-step inputs are canonical (groups in id order, whatever order they finished in);
rollouts are seeded per (run seed, iteration, group); a checkpoint after every iteration lets a later attempt continue
at the next iteration with its history; a checkpoint of another configuration, a torn or foreign one, or one naming
a missing adapter is a typed error; a NaN reward names its group and sample and nothing of that iteration is committed.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
from typing import ClassVar

from rl.algorithm.advantages import no_signal_groups
from rl.algorithm.checks import check_staleness, finite_rewards
from rl.errors import EngineContractError, GrpoInputError
from rl.identity import canonical, content_digest
from rl.loop.awaiting import results_in_order
from rl.loop.phase_timing import Scored, now, timed, with_eval_time
from rl.loop.spans import Span, scope
from rl.metrics import finite_mean
from rl.protocols import (
    Artifacts,
    CheckpointStore,
    Evaluator,
    PromptSource,
    Reporter,
    RolloutBuffer,
    RolloutEngine,
    Scorer,
    TaskMetrics,
    Trainer,
    is_batched,
)
from rl.seeding import adapter_init_seed, eval_seed, prompt_draw_seed, rollout_seed
from rl.storage.checkpoint.format import CheckpointEncoder, DriverState
from rl.storage.checkpoint.resume import check_recording, load_state, save_state
from rl.types import (
    DEFAULT_SAMPLING,
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


@dataclass(frozen=True)
class GrpoConfig:
    """One run's shape. Its digest is stored in the checkpoint: resuming under another configuration is refused."""

    # Validated from JSON (a Flyte `--config`) through pydantic: a key that is not a field is refused, not dropped.
    __pydantic_config__: ClassVar[dict[str, str]] = {"extra": "forbid"}

    iterations: int = 4
    prompts_per_iteration: int = 4
    group_size: int = 4
    seed: int = 0
    max_tokens: int = 4
    pipelined: bool = False
    max_staleness: int = 1
    eval_k: int = 4
    evaluate: bool = True
    eval_every: int = 1  # evaluate adapter versions divisible by this, and always the last one
    # How rollouts are drawn (temperature, top-p, top-k): set once here, the driver puts it on every request and every
    # train batch, so the trainer teacher-forces the distribution the engine sampled. Left out of the run's digest
    # while it holds the default (runs recorded before it existed resume).
    sampling: SamplingSettings = field(default=DEFAULT_SAMPLING, metadata={"identity": "omit_default"})

    def digest(self) -> str:
        return content_digest(self)

    def validate(self, train_prompts: Sequence[Prompt]) -> None:
        if self.iterations < 1:
            raise GrpoInputError(f"iterations must be >= 1, got {self.iterations}")
        if self.group_size < 2:
            raise GrpoInputError(
                f"group_size must be >= 2 (GRPO normalises rewards within a group), got {self.group_size}"
            )
        if not train_prompts:
            raise GrpoInputError("the prompt source has no training prompts; give it at least one")
        if not 1 <= self.prompts_per_iteration <= len(train_prompts):
            raise GrpoInputError(
                f"prompts_per_iteration must be in [1, {len(train_prompts)}] (the number of training prompts), "
                f"got {self.prompts_per_iteration}"
            )
        if self.max_staleness < (1 if self.pipelined else 0):
            raise GrpoInputError("the pipelined loop trains one-step-stale rollouts: max_staleness must be >= 1")
        if self.evaluate and (self.eval_k < 1 or self.eval_every < 1):
            raise GrpoInputError(f"eval_k and eval_every must be >= 1, got {self.eval_k} and {self.eval_every}")

    def evaluates(self, version: int) -> bool:
        return self.evaluate and (version % self.eval_every == 0 or version == self.iterations)


@dataclass(frozen=True)
class GrpoTiers:
    """The tiers the driver calls. `evaluator`, `reporter`, `buffer`, `span` and `task_metrics` are optional.

    `span(name)` is entered around the work of one iteration (`iter-<N>`: its rollouts, rewards and train step) and
    around each evaluation launch (`eval-v<version>`), the `flyte.group` role: every action started inside it, in
    tasks created there too, belongs to that group. Pipelined, iteration N+1's generation is launched inside its own
    group while iteration N trains in `iter-<N>`.

    `task_metrics` names the task's own metrics for each iteration's row (the driver knows no task: without it a row
    has reward, loss and the trainer's statistics, but no accuracy).
    """

    engine: RolloutEngine
    scorer: Scorer
    trainer: Trainer
    artifacts: Artifacts
    prompts: PromptSource
    evaluator: Evaluator | None = None
    reporter: Reporter | None = None
    buffer: RolloutBuffer | None = None
    span: Span | None = None
    task_metrics: TaskMetrics | None = None

    def scope(self, name: str) -> AbstractContextManager[object]:
        """`span(name)`, or a no-op when no span is bound."""
        return scope(self.span, name)


@dataclass(frozen=True)
class GrpoOutcome:
    adapter: ArtifactRef
    policy_version: int
    optimizer_state: ArtifactRef
    history: list[IterationMetrics]
    evals: list[EvalResult] = field(default_factory=list)
    resumed_from: int = -1
    buffer_version: str | None = None


def sample_prompts(config: GrpoConfig, prompts: Sequence[Prompt], iteration: int) -> list[Prompt]:
    """The iteration's prompts: a seeded draw without replacement, the same on every attempt."""
    rng = random.Random(prompt_draw_seed(config.seed, iteration))
    return rng.sample(list(prompts), config.prompts_per_iteration)


async def generate_and_score(
    config: GrpoConfig, tiers: GrpoTiers, iteration: int, adapter: ArtifactRef, version: int
) -> Scored:
    """Launch every group at once, score each the moment it lands, return both in canonical (group id) order with the
    seconds of each phase: `generate` until the last group landed, `score` the scoring left after it."""
    start = now()
    prompts = sample_prompts(config, tiers.prompts.train_prompts(), iteration)
    requests = [
        RolloutRequest(
            group_id=gid,
            prompt=p,
            n=config.group_size,
            adapter=adapter,
            policy_version=version,
            seed=rollout_seed(config.seed, iteration, gid),
            max_tokens=config.max_tokens,
            sampling=config.sampling,
        )
        for gid, p in enumerate(prompts)
    ]
    groups: dict[int, list[Rollout]] = {}
    scoring: dict[int, asyncio.Future[list[float]]] = {}
    generating: list[asyncio.Future[list[Rollout]]] = []
    last_landed = start

    def landed(group: list[Rollout]) -> None:
        nonlocal last_landed
        last_landed = now()
        gid = _check_group(group, requests, version)
        groups[gid] = group
        scoring[gid] = asyncio.ensure_future(tiers.scorer.score_group(group))

    try:
        if is_batched(tiers.engine):
            # One call for every group (one batch on an engine that batches); scoring starts when it returns.
            for group in await tiers.engine.generate_groups(requests):
                landed(group)
        else:
            generating = [asyncio.ensure_future(tiers.engine.generate(r)) for r in requests]
            for finished in asyncio.as_completed(generating):
                landed(await finished)
        if len(groups) != len(requests):
            raise EngineContractError(f"the engine returned {len(groups)} distinct groups for {len(requests)} requests")
        await results_in_order(list(scoring.values()))
    finally:
        for fut in generating:
            fut.cancel()
        for scored in scoring.values():
            scored.cancel()
    end = now()
    rollouts: list[Rollout] = []
    rewards: list[float] = []
    for gid in sorted(groups):
        group_rewards = scoring[gid].result()
        if len(group_rewards) != len(groups[gid]):
            raise EngineContractError(
                f"scorer returned {len(group_rewards)} rewards for group {gid} of {len(groups[gid])}"
            )
        refuse_non_finite(iteration, groups[gid], group_rewards)
        rollouts.extend(groups[gid])
        rewards.extend(float(r) for r in group_rewards)
    return Scored(rollouts, rewards, {"generate": last_landed - start, "score": end - last_landed})


def refuse_non_finite(iteration: int, group: Sequence[Rollout], rewards: Sequence[float]) -> None:
    """Raise `NonFiniteRewardError` naming the group and sample of the first NaN or infinite reward."""
    finite_rewards(
        rewards,
        lambda sample, reward: (
            f"iteration {iteration}: the scorer returned {reward} for group {group[sample].group_id}, sample "
            f"{sample} (prompt {group[sample].question!r}); iteration {iteration} was not trained or "
            "checkpointed. Fix the reward function so it always returns a finite float."
        ),
    )


def _check_group(group: list[Rollout], requests: list[RolloutRequest], version: int) -> int:
    if not group:
        raise EngineContractError("the engine returned an empty group")
    gid = group[0].group_id
    if not 0 <= gid < len(requests) or len(group) != requests[gid].n:
        raise EngineContractError(f"the engine returned {len(group)} rollouts for group {gid}; expected a full group")
    if any(r.group_id != gid or r.policy_version != version for r in group):
        raise EngineContractError(f"group {gid} mixes group ids or policy versions (expected v{version})")
    return gid


def iteration_metrics(
    iteration: int,
    version: int,
    rollouts: list[Rollout],
    rewards: list[float],
    step: StepMetrics,
    *,
    max_staleness: int,
    task_metrics: dict[str, float],
    phase_s: dict[str, float],
) -> IterationMetrics:
    """The iteration's row: reward and completion statistics, the train step's statistics, the task's metrics."""
    n = len(rollouts)
    group_ids = [r.group_id for r in rollouts]
    lengths = [len(r.token_ids) for r in rollouts]
    return IterationMetrics(
        iteration=iteration,
        policy_version=version,
        num_rollouts=n,
        mean_reward=finite_mean(rewards),
        max_reward=max(rewards),
        mean_loss=step.loss,
        contributing=step.contributing,
        sample_question=rollouts[0].question,
        sample_completion=rollouts[0].completion,
        sample_reward=rewards[0],
        no_signal_groups=len(no_signal_groups(group_ids, rewards)),
        max_staleness=max_staleness,
        num_groups=len(set(group_ids)),
        kl=step.kl,
        clip_frac=step.clip_frac,
        grad_norm=step.grad_norm,
        mean_completion_tokens=sum(lengths) / n,
        max_completion_tokens=max(lengths),
        task_metrics=dict(task_metrics),
        phase_s=dict(phase_s),
    )


async def _train(
    config: GrpoConfig,
    tiers: GrpoTiers,
    state: DriverState,
    iteration: int,
    scored: Scored,
) -> DriverState:
    rollouts, rewards = scored.rollouts, scored.rewards
    new_version = state.policy_version + 1
    worst = max(
        check_staleness(i, r.policy_version, state.policy_version, config.max_staleness, f"iteration {iteration}: ")
        for i, r in enumerate(rollouts)
    )
    batch = TrainBatch(
        step=iteration,
        rollouts=rollouts,
        rewards=rewards,
        adapter=state.adapter,
        optimizer_state=state.optimizer_state,
        new_version=new_version,
        sampling=config.sampling,
    )
    result, train_s = await timed(lambda: tiers.trainer.train_step(batch))
    if result.policy_version != new_version:
        raise EngineContractError(
            f"trainer returned adapter v{result.policy_version} for step {iteration}; expected v{new_version}"
        )
    row = iteration_metrics(
        iteration,
        new_version,
        rollouts,
        rewards,
        result.metrics,
        max_staleness=worst,
        task_metrics=tiers.task_metrics(rollouts, rewards) if tiers.task_metrics is not None else {},
        phase_s={**scored.phase_s, "train": train_s},
    )
    return replace(
        state,
        iteration=iteration,
        previous_adapter=state.adapter,
        previous_version=state.policy_version,
        adapter=result.adapter,
        policy_version=new_version,
        optimizer_state=result.optimizer_state,
        history=[*state.history, row],
    )


def _start_append(tiers: GrpoTiers, iteration: int, scored: Scored, parent: str | None) -> asyncio.Future[str] | None:
    """The iteration's rollouts on their way to the buffer while the step trains on them (a volume version is mostly
    fsyncs, which a thread overlaps with the step's compute). The checkpoint still follows both. A step that fails
    leaves the append behind; the resume repeats it, and a buffer answers a repeated append with the same version."""
    if tiers.buffer is None:
        return None
    return asyncio.ensure_future(tiers.buffer.append(iteration, scored.rollouts, scored.rewards, parent))


class _BatchSchedule:
    """Where each iteration's batch comes from: the pipelining schedule, in one place.

    Sequential, iteration N's batch is generated and scored when N starts, by the adapter trained at N-1. Pipelined,
    it was launched one iteration ahead (inside its own `iter-<N>` group while N-1 trained), by the adapter before:
    one step stale. Built before the loop, it launches the first iteration's batch when pipelined: on a resume, that
    batch comes from the checkpoint's previous adapter, the one that generated it the first time.
    """

    def __init__(self, config: GrpoConfig, tiers: GrpoTiers, state: DriverState, first: int) -> None:
        self.config, self.tiers = config, tiers
        self.pending: asyncio.Future[Scored] | None = None
        if config.pipelined and first < config.iterations:
            adapter, version = (
                (state.previous_adapter, state.previous_version)
                if state.previous_adapter is not None
                else (state.adapter, state.policy_version)
            )
            self._launch(first, adapter, version)

    async def take(self, iteration: int, state: DriverState) -> Scored:
        """Iteration `iteration`'s batch; pipelined, iteration + 1's is launched (by `state`'s adapter) first."""
        if not self.config.pipelined:
            return await generate_and_score(self.config, self.tiers, iteration, state.adapter, state.policy_version)
        assert self.pending is not None
        scored = await self.pending
        if iteration + 1 < self.config.iterations:
            self._launch(iteration + 1, state.adapter, state.policy_version)
        return scored

    def _launch(self, iteration: int, adapter: ArtifactRef, version: int) -> None:
        with self.tiers.scope(f"iter-{iteration}"):
            self.pending = asyncio.ensure_future(
                generate_and_score(self.config, self.tiers, iteration, adapter, version)
            )

    def cancel(self) -> None:
        if self.pending is not None:
            self.pending.cancel()


# A driver with `run_grpo`'s signature: ours, or a fork's under the conformance suite.
GrpoDriver = Callable[[GrpoConfig, GrpoTiers, CheckpointStore], Awaitable[GrpoOutcome]]


async def run_grpo(config: GrpoConfig, tiers: GrpoTiers, store: CheckpointStore) -> GrpoOutcome:
    """Run (or resume) the loop to `config.iterations`; return the final adapter, optimizer state and history."""
    config.validate(tiers.prompts.train_prompts())
    state = await load_state(store, config, tiers.artifacts)
    if state is not None:
        check_recording(state, buffered=tiers.buffer is not None)
    resumed_from = state.iteration if state is not None else -1
    if state is None:
        init = await tiers.trainer.init_adapter(adapter_init_seed(config.seed))
        state = replace(
            DriverState.initial(config.digest(), init.adapter, init.optimizer_state), config=canonical(config)
        )
    await _publish(tiers, state, "running")

    evaluating = _launch_eval(config, tiers, state.pending_eval)
    start = state.iteration + 1
    batches = _BatchSchedule(config, tiers, state, start)
    appending: asyncio.Future[str] | None = None
    checkpoints = CheckpointEncoder()
    try:
        for it in range(start, config.iterations):
            with tiers.scope(f"iter-{it}"):
                scored = await batches.take(it, state)
                appending = _start_append(tiers, it, scored, state.buffer_version)
                if appending is not None:
                    await asyncio.sleep(0)  # let the append start, so its writes overlap the step's compute
                state = await _train(config, tiers, state, it, scored)
            if appending is not None:
                state = replace(state, buffer_version=await appending)
            # Evaluation of step N runs while step N+1 generates and trains; it is awaited only after N+1.
            if evaluating is not None:
                state = with_eval_time(state, await evaluating)
            state = replace(
                state,
                pending_eval=(state.adapter, state.policy_version) if config.evaluates(state.policy_version) else None,
            )
            evaluating = _launch_eval(config, tiers, state.pending_eval)
            await _publish(tiers, state, "running")
            await save_state(store, state, checkpoints)
        if evaluating is not None:
            state = replace(with_eval_time(state, await evaluating), pending_eval=None)
    finally:
        batches.cancel()
        for fut in (evaluating, appending):
            if fut is not None:
                fut.cancel()
    await _publish(tiers, state, "complete")
    return GrpoOutcome(
        adapter=state.adapter,
        policy_version=state.policy_version,
        optimizer_state=state.optimizer_state,
        history=list(state.history),
        evals=list(state.evals),
        resumed_from=resumed_from,
        buffer_version=state.buffer_version,
    )


def _launch_eval(
    config: GrpoConfig, tiers: GrpoTiers, pending: tuple[ArtifactRef, int] | None
) -> asyncio.Future[tuple[EvalResult, float]] | None:
    if pending is None or tiers.evaluator is None or not config.evaluate:
        return None
    adapter, version = pending
    seed = eval_seed(config.seed, version)
    evaluator = tiers.evaluator
    with tiers.scope(f"eval-v{version}"):
        return asyncio.ensure_future(timed(lambda: evaluator.evaluate(adapter, version, config.eval_k, seed)))


async def _publish(tiers: GrpoTiers, state: DriverState, status: str) -> None:
    if tiers.reporter is not None:
        await tiers.reporter.publish(state.history, status=status, evals=state.evals)
