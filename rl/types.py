"""Data that crosses tier boundaries: immutable and JSON-serialisable. The GRPO loop's are frozen dataclasses, accepted
by Flyte's dataclass type engine; the agentic loop's (below) are frozen pydantic models.

Lists stay lists (not tuples) because Flyte's dataclass transformer round-trips them; the dataclasses are frozen so a
tier cannot rebind a field of a value it received.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict

from rl.errors import SamplingSettingsError
from rl.identity import RECORDED_AS, from_recorded, recorded_dict
from rl.strict_json import unflag_non_finite


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
class SamplingSettings:
    """How a token is drawn from the policy's logits z: from softmax(z / temperature), cut to the `top_k` most probable
    tokens (0: no cut), then to the smallest set of most probable tokens whose mass reaches `top_p` (1.0: no cut), and
    renormalised over what is left (the order vLLM and transformers apply them in; ties at a cut are kept).

    The log-prob an engine records for a token, and the one the trainer teacher-forces, is the token's log-prob under
    that tempered, truncated, renormalised distribution (the distribution sampled), so the importance ratio at the
    sampling policy is exactly 1 (`rl.samplers.decoding.sampling_logprobs`; declared to the conformance suite as
    `AlgorithmSpec(logprob_truncation="renormalised")`). The defaults sample the policy itself.

    Raises:
        SamplingSettingsError: a temperature that is not a finite number > 0, a top_p outside (0, 1], or a top_k that
            is not an int >= 0.
    """

    # Validated from JSON (a Flyte `--config`) through pydantic: a key that is not a field is refused, not dropped.
    __pydantic_config__: ClassVar[dict[str, str]] = {"extra": "forbid"}

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0

    def __post_init__(self) -> None:
        t, p, k = self.temperature, self.top_p, self.top_k
        if isinstance(t, bool) or not isinstance(t, int | float) or not (math.isfinite(t) and t > 0):
            raise SamplingSettingsError(
                f"temperature must be a finite number > 0, got {t!r}; use 1.0 to sample the policy itself (greedy "
                "decoding is not a sampling policy: its log-probs are not a distribution's)"
            )
        if isinstance(p, bool) or not isinstance(p, int | float) or not 0.0 < p <= 1.0:
            raise SamplingSettingsError(f"top_p must be a number in (0, 1], got {p!r}; use 1.0 for no top-p cut")
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise SamplingSettingsError(
                f"top_k must be an int >= 0, got {k!r}; use 0 for no top-k cut (vLLM's -1 is spelled 0 here)"
            )

    @property
    def is_default(self) -> bool:
        """True when the settings sample the policy's own distribution (temperature 1, no cut)."""
        return self.temperature == 1.0 and self.top_p == 1.0 and self.top_k == 0


DEFAULT_SAMPLING = SamplingSettings()
"""The policy's own distribution. A field holding it is left out of a value's content identity (`rl.identity`), so
traces, checkpoints and action ids recorded before sampling settings existed stay the same."""

_OMIT_AT_DEFAULT = {"identity": "omit_default"}


@dataclass(frozen=True)
class RolloutRequest:
    """One group: `n` completions of one prompt from adapter `adapter` (policy version `policy_version`), seeded,
    drawn as `sampling` says."""

    group_id: int
    prompt: Prompt
    n: int
    adapter: ArtifactRef
    policy_version: int
    seed: int
    max_tokens: int = 16
    sampling: SamplingSettings = field(default=DEFAULT_SAMPLING, metadata=_OMIT_AT_DEFAULT)


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
        # Spelled out: `asdict` deep-copies every list element, and the buffer converts every rollout it stores.
        return {
            "group_id": self.group_id,
            "question": self.question,
            "answer": self.answer,
            "completion": self.completion,
            "prompt_token_ids": list(self.prompt_token_ids),
            "token_ids": list(self.token_ids),
            "logprobs": list(self.logprobs),
            "policy_version": self.policy_version,
            "seed": self.seed,
        }

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
    new_version: int  # the policy_version this step makes (a role, as `previous_version`); in its action id
    # The settings the rollouts were sampled with: the trainer teacher-forces log-probs of the same distribution.
    sampling: SamplingSettings = field(default=DEFAULT_SAMPLING, metadata=_OMIT_AT_DEFAULT)


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
    policy_version: int
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
    """One row of the report per iteration (one line of `metrics.jsonl`).

    The driver fills every field from the iteration's rollouts, rewards and train result, except `task_metrics`: what
    the task defines (`GrpoTiers.task_metrics`: the digit task's accuracy, a `####` task's format rate too), so the row
    holds no metric that the task does not have. `kl` and `clip_frac` are the trainer's means over contributing
    samples (`StepMetrics`). The sample is the iteration's first rollout (group 0, sample 0), not the batch's best.

    `phase_s` holds the seconds each phase took on the driver's event-loop clock (`generate`: launch until the last
    group landed; `score`: the scoring left after that; `train`: the step; `evaluate`: the held-out evaluation of this
    row's adapter, off the critical path, filled in when it lands). It is left out of equality: a resumed run replays
    finished actions in no time, so its timings legitimately differ from an uninterrupted run it otherwise matches.
    """

    iteration: int
    # The policy version this iteration trained; recorded as `adapter_version` (metrics.jsonl, checkpoints).
    policy_version: int = field(metadata={RECORDED_AS: "adapter_version"})
    num_rollouts: int
    mean_reward: float
    max_reward: float
    mean_loss: float
    contributing: int
    sample_question: str
    sample_completion: str
    sample_reward: float
    no_signal_groups: int = 0
    max_staleness: int = 0
    extra: dict[str, float] = field(default_factory=dict)
    num_groups: int = 0
    kl: float = 0.0
    clip_frac: float = 0.0
    grad_norm: float = 0.0
    mean_completion_tokens: float = 0.0
    max_completion_tokens: int = 0
    task_metrics: dict[str, float] = field(default_factory=dict)
    phase_s: dict[str, float] = field(default_factory=dict, compare=False)

    def to_dict(self) -> dict[str, Any]:
        """The row as recorded (a line of `metrics.jsonl`, a checkpoint's history row)."""
        return recorded_dict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> IterationMetrics:
        d = from_recorded(cls, unflag_non_finite(d))
        # Rows written before task metrics existed carry the digit task's two as top-level keys.
        legacy = {key: d.pop(key) for key in _LEGACY_TASK_METRICS if key in d}
        if legacy:
            d["task_metrics"] = {**legacy, **d.get("task_metrics", {})}
        return cls(**d)


_LEGACY_TASK_METRICS = ("accuracy", "format_rate")


# -- the agentic loop's data (the agentic tutorial), as frozen pydantic models -----------------------------------------
# Every one of these is an action input or output, so its content is part of an action's identity: `Rubric` is an input
# of judging only, which is why changing it re-runs judging and what depends on it, and nothing else. Models are frozen
# (a tier cannot rebind a field of a value it received); list and dict fields are still Python containers, so code that
# derives a new value builds a new model (`bandit_update`) rather than mutating one in place.
#
# Departures from the tutorial, each deliberate: `TrialSpec`, `Trajectory` carry the run `seed` (the world's secret and
# every seeded draw depend on it, so a task stays a pure function of its inputs); a turn is a `Turn` model, not a dict;
# worlds travel as `WorldRef` (name and version of a sealed volume), the serialisable `ROVolume` role. They live here,
# beside the GRPO data, because `rl.protocols` names them and sits below `rl.agentic`.


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Weights(_Frozen):
    """The whole policy — small enough to travel as an input to every rollout (pull-based weight sync).

    `doc_prior[world_id][i]` is the bandit's weight on document `i` holding that world's secret.
    """

    version: int = 0
    doc_prior: dict[str, list[float]] = {}


class WorldRef(_Frozen):
    """A built world: the sealed, read-only volume version every trial of that world forks."""

    world_id: str
    name: str
    version: str


class TrialSpec(_Frozen):
    """One trial: which world, which prompt, at which step; `trial_id` seeds everything the trial draws."""

    trial_id: str
    step: int
    world_id: str
    prompt: str
    max_turns: int = 6
    seed: int = 0


class Turn(_Frozen):
    """One tool call: the document the agent read and whether it held the secret."""

    doc: int
    found: bool


class Trajectory(_Frozen):
    """What one trial did: its turns, its answer, the files it wrote into its private fork."""

    trial_id: str
    world_id: str
    weights_version: int
    turns: list[Turn]
    answer: str | None
    files_written: list[str]
    elapsed_s: float
    fork_name: str
    seed: int = 0


class Rubric(_Frozen):
    """Judge configuration. An input of judging, so changing it changes only the judging actions (and what follows)."""

    correctness_weight: float = 1.0
    efficiency_weight: float = 0.3
    tidiness_weight: float = 0.1
    name: str = "v1"


class Reward(_Frozen):
    """The verifier's verdict plus the judge's score for one trajectory; `reward` is what the trainer sees."""

    trial_id: str
    world_id: str
    verified_correct: bool
    n_turns: int
    judge_score: float
    reward: float
    found_doc: int | None


class StepResult(_Frozen):
    """One training step's outcome: the new (small) weights and the step's summary, with the trainer's identity."""

    step: int
    weights: Weights
    mean_reward: float
    mean_turns: float
    n_trials: int
    actor_pid: int


class TrainerInfo(_Frozen):
    """Who the trainer is (a process id for a Ray actor) and how far it has trained."""

    identity: int
    version: int
    applied_steps: list[int]
