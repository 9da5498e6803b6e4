"""The agentic loop's data (the agentic tutorial): what crosses a tier boundary, as frozen pydantic models.

Every one of these is an action input or output, so its content is part of an action's identity: `Rubric` is an input of
judging only, which is why changing it re-runs judging and what depends on it, and nothing else. Models are frozen (a
tier cannot rebind a field of a value it received); list and dict fields are still Python containers, so code that
derives a new value builds a new model (`bandit_update`) rather than mutating one in place.

Departures from the tutorial, each deliberate: `TrialSpec`, `Trajectory` carry the run `seed` (the world's secret and
every seeded draw depend on it, so a task stays a pure function of its inputs); a turn is a `Turn` model, not a dict;
worlds travel as `WorldRef` (name and version of a sealed volume), the serialisable `ROVolume` role.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


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
