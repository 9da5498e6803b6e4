"""What `--rl-impl module:attr` names: an `Implementation`, one factory per tier a fork provides."""

from __future__ import annotations

import importlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from rl.conformance.algorithm_spec import AlgorithmSpec
from rl.conformance.capabilities import Capabilities
from rl.conformance.law_sizes import LawSizes
from rl.errors import ImplementationError

if TYPE_CHECKING:
    from rl.loop.grpo import GrpoDriver
    from rl.protocols import Artifacts, CheckpointStore, RolloutEngine, Scorer, Trainer, VolumeStore
    from rl.types import ArtifactRef

__all__ = ["TIERS", "Implementation", "load_implementation"]

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
    "token_logprobs",
    "accumulated_loss",
    "batch_reward_scorer",
    "plant_rollout_rows",
)
"""The factory attributes that each bind one contract of the packaged suite."""


@dataclass(frozen=True)
class Implementation:
    """The tiers a fork provides, as factories; None for a tier it does not provide (its laws then skip, saying so).

    Each factory is called afresh for every test, so every law starts from new objects; `engine`, `adapter` and
    `trainer` receive the test's store (`artifacts()` when given, else an in-memory one). `driver`, `advantages`, the
    losses and the other plain functions are bound as they are. `capabilities`, `algorithm` and `sizes` declare what the
    implementation claims, its GRPO choices and how much the sampling laws draw; each default is ours.

    Every field's signature and the function of ours it mirrors: docs/conformance.md#implementation-every-field.
    """

    name: str
    artifacts: Callable[[], Artifacts] | None = None
    state_store: Callable[[], CheckpointStore] | None = None
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
    token_logprobs: Callable[..., Any] | None = None
    accumulated_loss: Callable[..., Sequence[Any]] | None = None
    batch_reward_scorer: Callable[[Callable[[list[str], list[str]], list[float]]], Scorer] | None = None
    plant_rollout_rows: Callable[[Any, int, Any], Any] | None = None
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
