"""What `--rl-impl module:attr` names: an `Implementation`, one factory per tier a fork provides."""

from __future__ import annotations

import importlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from rl.conformance.capabilities import Capabilities
from rl.conformance.sizes import LawSizes
from rl.conformance.spec import AlgorithmSpec

if TYPE_CHECKING:
    from rl.loop.grpo import GrpoDriver
    from rl.protocols import Artifacts, RolloutEngine, Scorer, StateStore, Trainer, VolumeStore
    from rl.types import ArtifactRef

__all__ = ["TIERS", "Implementation", "ImplementationError", "load_implementation"]

TIERS = (
    "artifacts",
    "state_store",
    "engine",
    "scorer",
    "trainer",
    "driver",
    "advantages",
    "sample_loss",
    "batch_loss",
    "ddp_shard_step",
    "agentic_driver",
    "judge_tier",
    "policy_trainer",
    "volume_store",
    "rollout_buffer",
    "extract_answer",
    "pass_at_k",
    "distributed_trainer",
    "micro_batched_trainer",
)
"""The factory attributes that each bind one contract of the packaged suite."""


class ImplementationError(ValueError):
    """`--rl-impl` does not name a usable implementation."""


@dataclass(frozen=True)
class Implementation:
    """The tiers a fork provides, as factories; None for a tier it does not provide (its laws then skip, saying so).

    Each factory is called afresh for every test, so every law starts from new objects.

    - `artifacts()`: a fresh, empty `rl.protocols.Artifacts` store.
    - `state_store()`: a fresh `rl.protocols.StateStore` nothing has saved to.
    - `engine(artifacts)`: a `RolloutEngine` reading adapters from `artifacts`.
    - `adapter(artifacts)`: the `ArtifactRef` (or an awaitable of it) of a version-0 adapter the engine can sample,
      stored in `artifacts`. Optional when `trainer` is given: the trainer's `init_adapter(0)` adapter is used.
    - `scorer()`: a `Scorer`.
    - `trainer(artifacts)`: a `Trainer` storing its adapters in `artifacts` (its laws sample batches with `engine`).
    - `driver`: the GRPO driver itself (not a factory): `async (config, tiers, store) -> GrpoOutcome`, like
      `rl.loop.grpo.run_grpo`; its laws run it on the simulator with the in-memory tiers.
    - `checkpoint_from_another_version`: `(blob) -> bytes`, a checkpoint `driver` saved, rewritten as another schema
      version of it would have saved the same state (what a resume by an older or newer release meets), like
      `rl.checkpoint.format.as_another_schema_version`. Optional when `driver` is `run_grpo` (ours is used); without
      it, the law that a driver refuses another schema version's checkpoint skips.
    - `checkpoint_altered`: `(blob) -> bytes`, a checkpoint `driver` saved with part of its state changed afterwards
      and its integrity check left as it was, like `rl.checkpoint.format.as_altered`. Optional when `driver` is
      `run_grpo` (ours is used); without it, the law that a driver refuses an altered checkpoint skips.
    - `advantages`: `(group_ids, rewards) -> list[float]`, like `rl.advantages.group_normalized_advantages`.
    - `sample_loss`: `(new_logp, old_logp, ref_logp, advantage, clip_eps, kl_beta) -> (loss, stats)` on 1-D torch
      tensors, like `rl.loss.grpo_sample_loss`; the loss laws lift it to the batch form (each completion, then the
      mean over completions).
    - `batch_loss`: `(new_logp, old_logp, ref_logp, advantages, mask, *, clip_eps, kl_beta) -> loss` or
      `(loss, stats)` on `[B, T]` tensors, `[B]` advantages and a `[B, T]` completion mask (1.0 on tokens, 0.0 on
      padding), as TRL-style trainers compute it. Bind one of `sample_loss` and `batch_loss`.
    - `ddp_shard_step`: `(ddp_model, sample_loss_fns, sync_forward) -> None`, like `rl.trainer.ddp.ddp_shard_step`
      (a module-level function: it is pickled to spawned gloo ranks).
    - `agentic_driver`: `async (config, tiers) -> AgenticOutcome`, like `rl.loop.agentic.run_agentic`.
    - `judge_tier(judge, trace)`: an object with `async verify_and_judge(traj, rubric)`, given the vendor `judge`
      and the durable `trace` decorator to memoise it with, like `rl.agentic.tiers.JudgeTier(trace(judge))`.
    - `policy_trainer(world_ids, identity)`: a `rl.agentic.bandit.PolicyTrainer` with exactly-once `update`, like
      `rl.agentic.bandit.BanditTrainer(world_ids, identity=identity)`.
    - `volume_store()`: a fresh, empty `rl.protocols.VolumeStore` (versioned copy-on-write volumes), a new one each
      call, like `rl.volumes.LocalVolumeStore(tempfile.mkdtemp())`.
    - `rollout_buffer()`: a fresh, empty rollout buffer with `append`, `read`, `iterations`, `versions` and `rescore`
      (the surface `rl.conformance.rollout_buffer` describes), a new one each call, like
      `rl.volumes.RolloutBuffer(LocalVolumeStore(tempfile.mkdtemp()), "rollouts")`.
    - `extract_answer`: `(completion) -> str | None`, like `rl.rewards.extract_answer`; `pass_at_k`: `(n, c, k) ->
      float`, like `rl.metrics.pass_at_k` (`rl.conformance.scoring_utilities`).
    - `distributed_trainer(artifacts, world_size)`: a `Trainer` whose `train_step` runs one step on `world_size`
      data-parallel ranks (`rl.conformance.ddp_trainer`), like `rl.conformance.ours.local_ddp_trainer`.
    - `micro_batched_trainer(artifacts, micro_batch_size)`: a `Trainer` that back-propagates `micro_batch_size`
      samples at a time and accumulates (`rl.conformance.micro_batch`), like
      `rl.conformance.ours.micro_batched_trainer`.
    - `capabilities`: what the implementation claims (`Capabilities()`, the default, claims everything).
    - `algorithm`: the GRPO choices its advantages and loss make (`AlgorithmSpec()`, the default, is ours); the
      algorithm laws compute their reference from it.
    - `sizes`: the share of their seeded groups the sampling engine laws draw (`LawSizes()`, the default, draws all;
      `LawSizes(draw_fraction=1/8)` for an engine whose forward pass is too dear for them, at less power).

    `engine`, `adapter` and `trainer` receive the test's store: `artifacts()` when given, else an in-memory store.
    """

    name: str
    artifacts: Callable[[], Artifacts] | None = None
    state_store: Callable[[], StateStore] | None = None
    engine: Callable[[Artifacts], RolloutEngine] | None = None
    adapter: Callable[[Artifacts], ArtifactRef | Awaitable[ArtifactRef]] | None = None
    scorer: Callable[[], Scorer] | None = None
    trainer: Callable[[Artifacts], Trainer] | None = None
    driver: GrpoDriver | None = None
    checkpoint_from_another_version: Callable[[bytes], bytes] | None = None
    checkpoint_altered: Callable[[bytes], bytes] | None = None
    advantages: Callable[..., Sequence[float]] | None = None
    sample_loss: Callable[..., Any] | None = None
    batch_loss: Callable[..., Any] | None = None
    ddp_shard_step: Callable[..., None] | None = None
    agentic_driver: Callable[..., Awaitable[Any]] | None = None
    judge_tier: Callable[..., Any] | None = None
    policy_trainer: Callable[..., Any] | None = None
    volume_store: Callable[[], VolumeStore] | None = None
    rollout_buffer: Callable[[], Any] | None = None
    extract_answer: Callable[[str], str | None] | None = None
    pass_at_k: Callable[[int, int, int], float] | None = None
    distributed_trainer: Callable[[Artifacts, int], Trainer] | None = None
    micro_batched_trainer: Callable[[Artifacts, int], Trainer] | None = None
    capabilities: Capabilities = field(default_factory=Capabilities)
    algorithm: AlgorithmSpec = field(default_factory=AlgorithmSpec)
    sizes: LawSizes = field(default_factory=LawSizes)

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if (
                f.name not in ("name", "capabilities", "algorithm", "sizes")
                and value is not None
                and not callable(value)
            ):
                raise ImplementationError(
                    f"Implementation {self.name!r}: `{f.name}` must be callable or None, got {type(value).__name__}"
                )
        if not isinstance(self.capabilities, Capabilities):
            raise ImplementationError(
                f"Implementation {self.name!r}: `capabilities` must be a rl.conformance.Capabilities, "
                f"got {type(self.capabilities).__name__}"
            )
        if not isinstance(self.algorithm, AlgorithmSpec):
            raise ImplementationError(
                f"Implementation {self.name!r}: `algorithm` must be a rl.conformance.AlgorithmSpec, "
                f"got {type(self.algorithm).__name__}"
            )
        if not isinstance(self.sizes, LawSizes):
            raise ImplementationError(
                f"Implementation {self.name!r}: `sizes` must be a rl.conformance.LawSizes, "
                f"got {type(self.sizes).__name__}"
            )
        if self.sample_loss is not None and self.batch_loss is not None:
            raise ImplementationError(
                f"Implementation {self.name!r} binds both `sample_loss` and `batch_loss`: bind one, the form your "
                "trainer calls (the loss laws check one loss)"
            )
        if self.sample_loss is not None and "token_mean" in (
            self.algorithm.loss_aggregation,
            self.algorithm.kl_aggregation,
        ):
            raise ImplementationError(
                f"Implementation {self.name!r} declares {self.algorithm.declared()}, a mean over the batch's tokens, "
                "which a per-completion `sample_loss` cannot express: bind `batch_loss`, or declare the aggregation "
                "your sample_loss has"
            )


def load_implementation(spec: str) -> Implementation:
    """Import `module:attr` (attr may be dotted) and return it as an `Implementation`.

    Any object with some of the factory attributes (`artifacts`, `engine`, ..., `capabilities`, `algorithm`, `sizes`) is
    accepted and wrapped.
    """
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ImplementationError(f"--rl-impl {spec!r} must look like 'package.module:ATTRIBUTE'")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ImplementationError(f"--rl-impl {spec!r}: cannot import {module_name!r}: {exc}") from exc
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ImplementationError(f"--rl-impl {spec!r}: {module_name!r} has no attribute {attr!r}") from None
    if isinstance(obj, Implementation):
        return obj
    found = {
        name: getattr(obj, name, None)
        for name in (*TIERS, "adapter", "checkpoint_from_another_version", "checkpoint_altered")
    }
    if not any(value is not None for value in found.values()):
        raise ImplementationError(
            f"--rl-impl {spec!r} names a {type(obj).__name__} with none of the factories {', '.join(TIERS)}; "
            "bind an rl.conformance.Implementation"
        )
    return Implementation(
        name=str(getattr(obj, "name", spec)),
        capabilities=getattr(obj, "capabilities", None) or Capabilities(),
        algorithm=getattr(obj, "algorithm", None) or AlgorithmSpec(),
        sizes=getattr(obj, "sizes", None) or LawSizes(),
        **found,
    )
