"""The algorithm choices an implementation declares, so the laws check what it chose, not what we chose.

Correct GRPO implementations differ by design: the population or the sample std or none (Dr. GRPO), the std's epsilon
and where it enters, what a group of one gets, how a batch's token losses are aggregated, which KL estimator (if any),
whether the loss ever sees a stale sample, and the floating-point type it computes in. `AlgorithmSpec` declares them
once; the advantage and loss laws compute their float64 reference from it (`rl.conformance.reference`), with
tolerances from the declared dtype. The default is our loop's choices (the tutorial's), so declaring nothing checks
that.

Pure Python: importing it pulls in neither torch nor hypothesis.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, Literal

__all__ = [
    "MACHINE_EPSILON",
    "SMALLEST_NORMAL",
    "AdvantageDtype",
    "AdvantageScale",
    "AlgorithmSpec",
    "ImportanceRatio",
    "KlEstimator",
    "LossAggregation",
    "LossDtype",
    "SingletonGroups",
    "StdEpsPlacement",
    "check_spec",
]

AdvantageScale = Literal["population_std", "sample_std", "none"]
StdEpsPlacement = Literal["std", "variance"]
SingletonGroups = Literal["zero", "reward"]
AdvantageDtype = Literal["float64", "float32"]
LossAggregation = Literal["sequence_mean", "constant", "sequence_sum", "token_mean"]
KlEstimator = Literal["k3", "k2", "k3_ratio", "none"]
ImportanceRatio = Literal["clipped", "on_policy"]
LossDtype = Literal["float64", "float32", "bfloat16"]

MACHINE_EPSILON = {"float64": 2.0**-52, "float32": 2.0**-23, "bfloat16": 2.0**-7}
"""`torch.finfo(dtype).eps` of each declarable dtype: the gap between 1 and the next representable number."""

SMALLEST_NORMAL = {"float64": 2.0**-1022, "float32": 2.0**-126, "bfloat16": 2.0**-126}
"""`torch.finfo(dtype).tiny`: below it a result may flush to zero, whatever its relative precision."""

_MEANING: dict[str, dict[str, str]] = {
    "advantage_scale": {
        "population_std": "A = (r - mean) / (pstdev + eps), dividing by n (GRPO as DeepSeekMath writes it; ours)",
        "sample_std": "A = (r - mean) / (stdev + eps), dividing by n - 1 (torch.std's default: TRL, OpenRLHF, verl)",
        "none": "A = r - mean, no division (Dr. GRPO)",
    },
    "std_eps_placement": {
        "std": "the std plus eps: (r - mean) / (std + eps)",
        "variance": "eps inside the square root: (r - mean) / sqrt(var + eps)",
    },
    "singleton_groups": {
        "zero": "a group of one gets A = 0 (nothing to compare it with; ours)",
        "reward": "a group of one is scaled as if its mean were 0 and its std 1 (verl): A = r / (1 + eps) with "
        "std_eps_placement='std', r / sqrt(1 + eps) with 'variance', r with advantage_scale='none'",
    },
    "advantage_dtype": {
        "float64": "the advantages are computed in float64 (Python floats, numpy or torch float64; ours)",
        "float32": "the advantages are computed in float32 (a torch float32 rewards tensor)",
    },
    "loss_aggregation": {
        "sequence_mean": "each sequence's token mean, then the mean over sequences (GRPO's 1/G sum_i 1/|o_i| sum_t; "
        "ours)",
        "constant": "each sequence's token sum divided by a constant loss_normalizer L, then the mean over sequences "
        "(Dr. GRPO: L is the max completion length)",
        "sequence_sum": "each sequence's token sum, then the mean over sequences",
        "token_mean": "the sum over the batch's tokens divided by their number (DAPO's token-level mean; needs "
        "batch_loss)",
    },
    "kl_estimator": {
        "k3": "kl_beta * (exp(d) - d - 1), d = ref - new (Schulman's k3; ours)",
        "k2": "kl_beta * d**2 / 2, d = ref - new (Schulman's k2)",
        "k3_ratio": "kl_beta * r * (exp(d) - d - 1), r = exp(new - old) not detached (TRL's use_bias_correction_kl, "
        "its default when beta > 0): at ratio 1 the value of k3 and the gradient of k2",
        "none": "no KL penalty (kl_beta = 0): the laws pass kl_beta=0.0 and the KL laws skip",
    },
    "importance_ratio": {
        "clipped": "min(r A, clip(r, 1 - eps, 1 + eps) A) with r = exp(new - old): stale samples are clipped (ours)",
        "on_policy": "the loss is only ever given fresh samples (old == new: one PPO epoch, no pipelining): the laws "
        "pass old_logp = new_logp, compare gradients only (the value of an on-policy loss is a convention), and the "
        "clip law skips",
    },
    "loss_dtype": {
        "float64": "the loss is computed in float64: the laws pass float64 tensors (ours, as the laws call it)",
        "float32": "the loss is computed in float32: the laws pass float32 tensors (our trainer's dtype)",
        "bfloat16": "the loss is computed in bfloat16: the laws pass bfloat16 tensors",
    },
}


@dataclass(frozen=True)
class AlgorithmSpec:
    """The GRPO design choices of an implementation's advantages and loss. The defaults are ours.

    Bind it as `Implementation(..., algorithm=AlgorithmSpec(advantage_scale="sample_std", std_eps=1e-6))`, or
    return it from the `algorithm` fixture of a contract subclass. `AlgorithmSpec.choices()` lists every field's
    values and what each means. The advantage fields:

    - `advantage_scale`: "population_std" (ours), "sample_std" (torch.std's default) or "none" (Dr. GRPO).
    - `std_eps`: the epsilon of the denominator (ours 1e-4; TRL 1e-4, verl 1e-6, OpenRLHF 1e-9); ignored when the
      scale is "none".
    - `std_eps_placement`: "std" (`std + eps`, ours) or "variance" (`sqrt(var + eps)`).
    - `singleton_groups`: what a group of one sample gets: "zero" (ours) or "reward" (verl's mean 0, std 1).
    - `advantage_dtype`: "float64" (ours) or "float32": the tolerance of the advantage choice laws.

    The loss fields:

    - `loss_aggregation`: "sequence_mean" (ours), "constant" (Dr. GRPO, with `loss_normalizer`), "sequence_sum" or
      "token_mean" (the batch's token mean; only a `batch_loss` can declare it).
    - `loss_normalizer`: the constant L of "constant" (e.g. the max completion length); None otherwise.
    - `kl_estimator`: "k3" (ours), "k2", "k3_ratio" (k3 times the importance ratio, TRL's) or "none" (no KL term;
      kl_beta = 0 is a valid configuration).
    - `kl_clamp`: None (ours), or the bound C each token's KL estimate is clamped to, min(k, C) (verl's low_var_kl
      clamps k3 at 10): beyond it the penalty is flat.
    - `importance_ratio`: "clipped" (ours: stale samples are clipped) or "on_policy" (the loss never sees one).
    - `dual_clip`: None (ours), or the bound c > 1 of a dual clip (Ye et al. 2020, "Mastering Complex Control in MOBA
      Games"; verl's clip_ratio_c = 3): for A < 0 the objective is max(min(r A, clip(r) A), c A), so a ratio above c
      is flat. Only stale samples reach it, so it changes nothing under importance_ratio="on_policy".
    - `loss_dtype`: "float64", "float32" or "bfloat16": the dtype of the tensors the loss laws pass, and their
      tolerance.

    Raises:
        ValueError: an unknown value (the message lists the choices), a negative or non-finite `std_eps`, or a
            `loss_normalizer` missing for "constant" or given for another aggregation (the message says what to set).
        TypeError: a field of the wrong type.
    """

    advantage_scale: AdvantageScale = "population_std"
    std_eps: float = 1e-4
    std_eps_placement: StdEpsPlacement = "std"
    singleton_groups: SingletonGroups = "zero"
    advantage_dtype: AdvantageDtype = "float64"
    loss_aggregation: LossAggregation = "sequence_mean"
    loss_normalizer: float | None = None
    kl_estimator: KlEstimator = "k3"
    kl_clamp: float | None = None
    importance_ratio: ImportanceRatio = "clipped"
    dual_clip: float | None = None
    loss_dtype: LossDtype = "float64"

    def __post_init__(self) -> None:
        for name, meanings in _MEANING.items():
            value = getattr(self, name)
            if value not in meanings:
                listed = "; ".join(f"{choice!r}: {what}" for choice, what in meanings.items())
                raise ValueError(
                    f"AlgorithmSpec.{name} must be one of {', '.join(map(repr, meanings))}, got {value!r} ({listed})"
                )
        if isinstance(self.std_eps, bool) or not isinstance(self.std_eps, int | float):
            raise TypeError(f"AlgorithmSpec.std_eps must be a float, got {type(self.std_eps).__name__}")
        if not (math.isfinite(self.std_eps) and self.std_eps >= 0.0):
            raise ValueError(f"AlgorithmSpec.std_eps must be finite and >= 0, got {self.std_eps!r}")
        if self.loss_aggregation == "constant":
            normalizer = self.loss_normalizer
            if normalizer is None:
                raise ValueError(
                    "AlgorithmSpec(loss_aggregation='constant') must declare loss_normalizer=L, the constant each "
                    "sequence's token sum is divided by (Dr. GRPO's max completion length, e.g. loss_normalizer=1024)"
                )
            if isinstance(normalizer, bool) or not isinstance(normalizer, int | float):
                raise TypeError(f"AlgorithmSpec.loss_normalizer must be a number, got {type(normalizer).__name__}")
            if not (math.isfinite(normalizer) and normalizer > 0):
                raise ValueError(f"AlgorithmSpec.loss_normalizer must be finite and > 0, got {normalizer!r}")
        elif self.loss_normalizer is not None:
            raise ValueError(
                f"AlgorithmSpec.loss_normalizer={self.loss_normalizer!r} is only used by loss_aggregation='constant' "
                f"(this spec declares {self.loss_aggregation!r}): drop it, or set loss_aggregation='constant'"
            )
        _check_bound("dual_clip", self.dual_clip, above=1.0, meaning="the dual clip's c, which must exceed 1")
        _check_bound("kl_clamp", self.kl_clamp, above=0.0, meaning="the bound each token's KL estimate is clamped to")
        if self.kl_clamp is not None and self.kl_estimator == "none":
            raise ValueError(
                "AlgorithmSpec(kl_clamp=...) clamps a KL penalty, and kl_estimator='none' declares none: drop "
                "kl_clamp, or declare the estimator it clamps"
            )

    def __repr__(self) -> str:
        return self.declared()

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        """Hypothesis prints a falsifying example's declaration as `declared()`, not field by field."""
        printer.text(self.declared())

    @classmethod
    def choices(cls) -> dict[str, dict[str, str]]:
        """Every field with a fixed set of values: `{field: {value: what it means}}`."""
        return {name: dict(meanings) for name, meanings in _MEANING.items()}

    def declared(self) -> str:
        """The fields that differ from ours, as `AlgorithmSpec(...)` source: what a failure message shows."""
        default = AlgorithmSpec()
        changed = [
            f"{f.name}={getattr(self, f.name)!r}"
            for f in fields(self)
            if getattr(self, f.name) != getattr(default, f.name)
        ]
        return f"AlgorithmSpec({', '.join(changed)})"


def _check_bound(name: str, value: Any, *, above: float, meaning: str) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"AlgorithmSpec.{name} must be a number or None, got {type(value).__name__}")
    if not (math.isfinite(value) and value > above):
        raise ValueError(f"AlgorithmSpec.{name} is {meaning}: it must be finite and > {above}, got {value!r}")


def check_spec(spec: Any) -> AlgorithmSpec:
    """`spec` itself if it is an `AlgorithmSpec`; a TypeError that says what to return otherwise."""
    if not isinstance(spec, AlgorithmSpec):
        raise TypeError(
            f"the `algorithm` fixture returned {type(spec).__name__}; return a rl.conformance.AlgorithmSpec "
            "(e.g. AlgorithmSpec(advantage_scale='sample_std')), or AlgorithmSpec() for our choices"
        )
    return spec
