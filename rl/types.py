"""Data that crosses tier boundaries: immutable, JSON-serialisable, and accepted by Flyte's dataclass type engine.

Lists stay lists (not tuples) because Flyte's dataclass transformer round-trips them; the dataclasses are frozen so a
tier cannot rebind a field of a value it received.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class ArtifactRef:
    """A handle on an immutable directory-like artifact (the `flyte.io.Dir` role): where it lives and what it holds."""

    uri: str
    digest: str


@dataclass(frozen=True)
class Prompt:
    """One verifiable problem: the question the policy sees and the reference answer the scorer checks."""

    question: str
    answer: str


@dataclass(frozen=True)
class RolloutRequest:
    """One group: `n` completions of one prompt from adapter `adapter` (policy version `policy_version`), seeded."""

    group_id: int
    prompt: Prompt
    n: int
    adapter: ArtifactRef
    policy_version: int
    seed: int
    max_tokens: int = 16


@dataclass(frozen=True)
class Rollout:
    """One sampled completion with everything the trainer needs to compute an importance ratio."""

    group_id: int
    question: str
    answer: str
    completion: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    policy_version: int
    seed: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Rollout:
        return cls(**d)


@dataclass(frozen=True)
class TrainBatch:
    """The inputs of one training step; canonical order (by group, then sample) so its identity ignores finish order."""

    step: int
    rollouts: list[Rollout]
    rewards: list[float]
    adapter: ArtifactRef
    optimizer_state: ArtifactRef | None
    new_version: int


@dataclass(frozen=True)
class StepMetrics:
    """What one training step reports back to the driver."""

    loss: float
    contributing: int
    skipped_zero_advantage: int
    kl: float = 0.0
    clip_frac: float = 0.0
    grad_norm: float = 0.0
    max_staleness: int = 0


@dataclass(frozen=True)
class TrainResult:
    """The outputs of one training step: the next adapter, the optimizer state to feed the step after, metrics."""

    adapter: ArtifactRef
    optimizer_state: ArtifactRef
    version: int
    metrics: StepMetrics


@dataclass(frozen=True)
class EvalResult:
    """Held-out evaluation of one policy version: k samples per problem."""

    policy_version: int
    k: int
    avg_at_k: float
    pass_at_k: float
    problems: int


@dataclass(frozen=True)
class IterationMetrics:
    """One row of the report per iteration: the seed's fields, plus no-signal groups and staleness."""

    iteration: int
    adapter_version: int
    num_rollouts: int
    mean_reward: float
    max_reward: float
    accuracy: float
    format_rate: float
    mean_loss: float
    contributing: int
    sample_question: str
    sample_completion: str
    sample_reward: float
    no_signal_groups: int = 0
    max_staleness: int = 0
    extra: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> IterationMetrics:
        return cls(**d)
