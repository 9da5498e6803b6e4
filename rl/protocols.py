"""What the drivers call. Each tier is a small Protocol; production binds them to Flyte tasks, tests to in-memory tiers.

Every method is async because in production each call is a remote task (an action); the driver never knows which it has.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol, TypeGuard, runtime_checkable

from rl.types import (
    ArtifactRef,
    EvalResult,
    IterationMetrics,
    Prompt,
    Reward,
    Rollout,
    RolloutRequest,
    Rubric,
    StepResult,
    TrainBatch,
    TrainResult,
    Trajectory,
    TrialSpec,
    Weights,
    WorldRef,
)


@runtime_checkable
class RolloutEngine(Protocol):
    """Samples one group per call: `request.n` completions of one prompt from the requested adapter, seeded.

    Contract: the same request gives the same rollouts (a retried rollout is identical); each rollout carries
    `request.policy_version`, its token ids and the sampling log-probability of each token.
    """

    async def generate(self, request: RolloutRequest) -> list[Rollout]: ...


@runtime_checkable
class BatchedRolloutEngine(RolloutEngine, Protocol):
    """A `RolloutEngine` that can also sample several groups in one call, which the driver and evaluator then use.

    Contract: result `i` is what `generate(requests[i])` returns (log-probs up to the float rounding of a larger
    batch), and the same list of requests gives the same rollouts: the driver always passes one iteration's groups in
    group-id order, so a resumed iteration repeats the call exactly.
    """

    async def generate_groups(self, requests: Sequence[RolloutRequest]) -> list[list[Rollout]]: ...


def is_batched(engine: object) -> TypeGuard[BatchedRolloutEngine]:
    """`isinstance(engine, BatchedRolloutEngine)` as 3.11 decides it (each member is an attribute that is not None,
    forwarded ones included: 3.12's static lookup misses the simulator's tier wrappers), without its walk over the
    protocol's members: the driver asks it twice an iteration, and on 3.11 the walk was a twentieth of a GRPO run."""
    return getattr(engine, "generate_groups", None) is not None and getattr(engine, "generate", None) is not None


@runtime_checkable
class Scorer(Protocol):
    """Scores one group of rollouts; returns one finite reward per rollout, in the same order."""

    async def score_group(self, rollouts: Sequence[Rollout]) -> list[float]: ...


@runtime_checkable
class Trainer(Protocol):
    """Owns the policy update. Pure in its inputs: replaying a batch gives bitwise-identical outputs."""

    async def init_adapter(self, seed: int) -> TrainResult:
        """The version-0 adapter and an empty optimizer state."""
        ...

    async def train_step(self, batch: TrainBatch) -> TrainResult: ...


@runtime_checkable
class Evaluator(Protocol):
    """Held-out evaluation of one adapter: k samples per problem, avg@k and pass@k."""

    async def evaluate(self, adapter: ArtifactRef, policy_version: int, k: int, seed: int) -> EvalResult: ...


@runtime_checkable
class CheckpointStore(Protocol):
    """The driver's checkpoint (the `flyte.ctx().checkpoint` role): one blob, written atomically."""

    async def load(self) -> bytes | None: ...

    async def save(self, data: bytes) -> None: ...


@runtime_checkable
class Artifacts(Protocol):
    """Directory-like artifacts with copy semantics (the `flyte.io.Dir` role): `get` returns a private copy."""

    async def put(self, files: Mapping[str, bytes], *, name: str) -> ArtifactRef: ...

    async def get(self, ref: ArtifactRef) -> dict[str, bytes]: ...

    async def exists(self, ref: ArtifactRef) -> bool: ...


@runtime_checkable
class Reporter(Protocol):
    """Publishes the live report (the `flyte.report` role)."""

    async def publish(
        self, history: Sequence[IterationMetrics], *, status: str, evals: Sequence[EvalResult] = ()
    ) -> None: ...


@runtime_checkable
class RolloutBuffer(Protocol):
    """The rollout buffer of the training-loop tutorial: each iteration's rollouts and rewards, as a chain of volume
    versions.

    The GRPO driver appends an iteration while its train step runs (a step that then fails leaves the append behind, and
    the resume appends it again); the checkpoint names the version only after both succeeded.
    """

    async def append(
        self, iteration: int, rollouts: Sequence[Rollout], rewards: Sequence[float], parent: str | None
    ) -> str:
        """Fork `parent` (None: a new buffer), add the iteration, return the new version's id.

        Appending the same rows for an iteration again (a replayed step) returns the same version.
        """
        ...


@runtime_checkable
class PromptSource(Protocol):
    """The training and held-out problems."""

    def train_prompts(self) -> Sequence[Prompt]: ...

    def eval_prompts(self) -> Sequence[Prompt]: ...


class TaskMetrics(Protocol):
    """The task's own metrics over one iteration's scored rollouts, by name (accuracy, format rate, ...).

    The driver calls it in its own process after scoring and stores the result in the iteration's row, so it is pure,
    cheap and deterministic in its inputs (a resumed run recomputes it). Return only metrics the task has: the report
    draws one chart per name.
    """

    def __call__(self, rollouts: Sequence[Rollout], rewards: Sequence[float]) -> dict[str, float]: ...


@runtime_checkable
class VolumeVersion(Protocol):
    """A finalized, immutable volume version (the `ROVolume` role)."""

    @property
    def name(self) -> str: ...

    @property
    def version(self) -> str: ...

    def path(self) -> Path:
        """A read-only view of the files."""
        ...

    def fork(self, name: str) -> WritableVolume: ...


@runtime_checkable
class WritableVolume(Protocol):
    """A fork with exactly one writer; `finalize` seals it into a new immutable version."""

    @property
    def name(self) -> str: ...

    def mount(self) -> Path: ...

    def finalize(self, message: str) -> VolumeVersion: ...


@runtime_checkable
class VolumeStore(Protocol):
    """Where volumes live: new volumes, and every finalized version by id or by name
    (`rl.storage.volumes.LocalVolumeStore`)."""

    def new(self, name: str) -> WritableVolume:
        """An empty writable volume named `name`, its first version's writer."""
        ...

    def open(self, name_or_version: str) -> VolumeVersion:
        """A finalized version by its id, or the latest version of the volume `name`."""
        ...

    def versions(self, name: str | None = None) -> Sequence[VolumeVersion]:
        """Every finalized version (of volume `name` if given), oldest first."""
        ...


@runtime_checkable
class Workspace(Protocol):
    """A trial's private writable copy of a world. Exactly one writer; `finalize` seals it, `abandon` drops it."""

    @property
    def name(self) -> str: ...

    def read_text(self, relpath: str) -> str: ...

    def write_text(self, relpath: str, text: str) -> None: ...

    def finalize(self, message: str) -> str:
        """Seal the fork; returns its version."""
        ...

    def abandon(self) -> None: ...


@runtime_checkable
class WorldStore(Protocol):
    """Sealed world versions and their per-trial forks."""

    def seal(self, name: str, files: Mapping[str, str], message: str) -> str:
        """Write `files` into a new volume `name` and seal it; returns the version every trial will fork."""
        ...

    def fork(self, version: str, name: str) -> Workspace: ...

    def read(self, version: str) -> dict[str, str]:
        """Every file of a sealed version, by path."""
        ...


class AgenticTiers(Protocol):
    """What the agentic driver calls (the agentic tutorial). Each `async` method is one durable action; `driver_attempt`
    is FLYTE_ATTEMPT_NUMBER. Faults are injected by wrapping an implementation (`rl.agentic.faults`), never by an
    argument.
    """

    def driver_attempt(self) -> int: ...

    async def build_world(self, world_id: str, seed: int) -> WorldRef: ...

    async def setup_trainer(self, world_ids: list[str]) -> Weights: ...

    async def generate(self, spec: TrialSpec, weights: Weights, world: WorldRef) -> Trajectory: ...

    async def verify_and_judge(self, traj: Trajectory, rubric: Rubric) -> Reward: ...

    async def train_step(self, step: int, rewards: list[Reward], world_ids: list[str], lr: float) -> StepResult: ...
