"""The driver checkpoint's typed schema: every field of a `DriverState` read from disk, checked before it is used.

A checkpoint may come in a run directory someone sent, with its digest recomputed (a digest is a checksum anyone can
recompute, not a seal), so its fields are input: a string where an int goes, a negative iteration, a 100 MB sample, or
markup in a number's place would otherwise reach the driver and the report. Strict mode: no coercion ("3" is not 3,
True is not 1, 1.5 is not an int). Floats of a history row may be non-finite (a diverged loss is recorded as it was);
those of an evaluation may not.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, StrictInt, TypeAdapter

from rl.untrusted import StrictModel

# Bounds far beyond any run this tool makes, well short of what would exhaust memory or time.
Count = Annotated[int, Field(ge=0, le=10**12)]
Text = Annotated[str, Field(max_length=1 << 20)]
Name = Annotated[str, Field(max_length=200)]
FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]


class RefModel(StrictModel):
    uri: Annotated[str, Field(max_length=4096)]
    digest: Name


class EvalModel(StrictModel):
    policy_version: Count
    k: Annotated[int, Field(ge=1, le=10**6)]
    avg_at_k: Annotated[float, Field(ge=0.0, le=1.0)]
    pass_at_k: Annotated[float, Field(ge=0.0, le=1.0)]
    problems: Count


class RowModel(StrictModel):
    """One `IterationMetrics` row (with the digit task's two legacy top-level metrics, which older rows carry)."""

    iteration: Count
    adapter_version: Count  # IterationMetrics.policy_version, by its recorded name
    num_rollouts: Count
    mean_reward: float
    max_reward: float
    mean_loss: float
    contributing: Count
    sample_question: Text
    sample_completion: Text
    sample_reward: float
    no_signal_groups: Count = 0
    max_staleness: Count = 0
    extra: Annotated[dict[Name, float], Field(max_length=1000, default_factory=dict)]
    num_groups: Count = 0
    kl: float = 0.0
    clip_frac: float = 0.0
    grad_norm: float = 0.0
    mean_completion_tokens: float = 0.0
    max_completion_tokens: Count = 0
    task_metrics: Annotated[dict[Name, float], Field(max_length=1000, default_factory=dict)]
    phase_s: Annotated[dict[Name, FiniteFloat], Field(max_length=100, default_factory=dict)]
    accuracy: float | None = None
    format_rate: float | None = None


class StateModel(StrictModel):
    config_digest: Name
    iteration: Annotated[int, Field(ge=-1, le=10**12)]
    adapter: RefModel
    adapter_version: Count  # DriverState.policy_version, by its recorded name
    optimizer_state: RefModel
    history: list[RowModel]
    evals: list[EvalModel]
    previous_adapter: RefModel | None = None
    previous_version: Count = 0
    # JSON has no tuple: the pair is an array, so this one field takes a list (its items stay strict).
    pending_eval: Annotated[tuple[RefModel, StrictInt], Field(strict=False)] | None = None
    buffer_version: Name | None = None
    config: dict[Name, Any] | None = None


STATE = TypeAdapter(StateModel)
