"""The algorithm choices an implementation declares, so the laws check what it chose, not what we chose.

Correct GRPO implementations differ by design: the population or the sample std or none (Dr. GRPO), the std's epsilon
and where it enters, what a group of one gets, how a batch's token losses are aggregated, which KL estimator (if any),
whether the loss ever sees a stale sample, and the floating-point type it computes in. `AlgorithmSpec` declares them
once; the advantage and loss laws compute their float64 reference from it (`rl.conformance.support.reference`), with
tolerances from the declared dtype. The default is our loop's choices (the tutorial's), so declaring nothing checks
that.

Pure Python: importing it pulls in neither torch nor hypothesis.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, Literal

__all__ = [
    "ADVANTAGE_FIELDS",
    "LOSS_FIELDS",
    "MACHINE_EPSILON",
    "SMALLEST_NORMAL",
    "AdvantageBaseline",
    "AdvantageDtype",
    "AdvantageScale",
    "AlgorithmSpec",
    "ImportanceRatio",
    "KlEstimator",
    "KlReference",
    "LogprobTruncation",
    "LossAggregation",
    "LossDtype",
    "SingletonGroups",
    "StdEpsPlacement",
    "StdScope",
    "StepNormaliser",
    "TruncatedCompletions",
    "check_spec",
]

AdvantageScale = Literal["population_std", "sample_std", "none"]
AdvantageBaseline = Literal["group_mean", "leave_one_out"]
StdScope = Literal["group", "batch"]
StdEpsPlacement = Literal["std", "variance", "floor"]
SingletonGroups = Literal["zero", "reward", "refused"]
AdvantageDtype = Literal["float64", "float32"]
LossAggregation = Literal["sequence_mean", "constant", "sequence_sum", "token_mean"]
KlEstimator = Literal["k3", "k2", "k3_ratio", "k3_value_k2_grad", "none"]
ImportanceRatio = Literal["clipped", "sequence", "cispo", "on_policy"]
LossDtype = Literal["float64", "float32", "bfloat16"]
LogprobTruncation = Literal["renormalised", "ignored"]
TruncatedCompletions = Literal["kept", "masked"]
KlReference = Literal["base", "initial_adapter"]
StepNormaliser = Literal["step", "generation_mean"]

MACHINE_EPSILON = {"float64": 2.0**-52, "float32": 2.0**-23, "bfloat16": 2.0**-7}
"""`torch.finfo(dtype).eps` of each declarable dtype: the gap between 1 and the next representable number."""

SMALLEST_NORMAL = {"float64": 2.0**-1022, "float32": 2.0**-126, "bfloat16": 2.0**-126}
"""`torch.finfo(dtype).tiny`: below it a result may flush to zero, whatever its relative precision."""

_MEANING: dict[str, dict[Any, str]] = {
    "advantage_scale": {
        "population_std": "A = (r - mean) / (pstdev + eps), dividing by n (GRPO as DeepSeekMath writes it; ours)",
        "sample_std": "A = (r - mean) / (stdev + eps), dividing by n - 1 (torch.std's default: TRL, OpenRLHF, verl)",
        "none": "A = r - mean, no division (Dr. GRPO)",
    },
    "advantage_baseline": {
        "group_mean": "r - mean of the group, every member included (GRPO; ours)",
        "leave_one_out": "r_i - mean of the group's other members, and the std of those others (RLOO's baseline; "
        "NeMo-RL's use_leave_one_out_baseline): a member whose others all agree is not scaled (D = 1)",
    },
    "std_scope": {
        "group": "the std of the sample's own group (ours)",
        "batch": "one std over every reward of the batch the function is given, the mean still the group's (TRL's "
        "scale_rewards='batch'): a group's advantages then depend on the other groups by one positive factor",
    },
    "std_eps_placement": {
        "std": "the std plus eps: (r - mean) / (std + eps)",
        "variance": "eps inside the square root: (r - mean) / sqrt(var + eps)",
        "floor": "the std floored at eps: (r - mean) / max(std, eps)",
    },
    "singleton_groups": {
        "zero": "a group of one gets A = 0 (nothing to compare it with; ours)",
        "reward": "a group of one is scaled as if its mean were 0 and its std 1 (verl): A = r / (1 + eps) with "
        "std_eps_placement='std', r / sqrt(1 + eps) with 'variance', r / max(1, eps) with 'floor', r with "
        "advantage_scale='none'",
        "refused": "a group of one never occurs: the function refuses it (raises, or returns NaN for that sample), "
        "and the other laws never send one",
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
        "k3_value_k2_grad": "kl_beta * exp(new - sg(new)) * (exp(d) - d - 1): k3's value and k2's gradient (-d) at "
        "every ratio (NeMo-RL's default KL, its on-policy score-function weight)",
        "none": "no KL penalty (kl_beta = 0): the laws pass kl_beta=0.0 and the KL laws skip",
    },
    "importance_ratio": {
        "clipped": "min(r A, clip(r, 1 - eps, 1 + eps) A) with r = exp(new - old): stale samples are clipped (ours)",
        "sequence": "the same clip, with each completion's ratio s = exp(mean over its tokens of new - old) on every "
        "token (GSPO: TRL's and OpenRLHF's importance_sampling_level='sequence')",
        "cispo": "-sg(min(r, ratio_cap)) A new: REINFORCE weighted by the truncated, detached token ratio, never "
        "zeroed (CISPO, MiniMax-M1; TRL's loss_type='cispo' with epsilon_high = ratio_cap); its value is a convention, "
        "so the laws compare gradients",
        "on_policy": "the loss is only ever given fresh samples (old == new: one PPO epoch, no pipelining): the laws "
        "pass old_logp = new_logp, compare gradients only (the value of an on-policy loss is a convention), and the "
        "clip law skips",
    },
    "loss_dtype": {
        "float64": "the loss is computed in float64: the laws pass float64 tensors (ours, as the laws call it)",
        "float32": "the loss is computed in float32: the laws pass float32 tensors (our trainer's dtype)",
        "bfloat16": "the loss is computed in bfloat16: the laws pass bfloat16 tensors",
    },
    "kl_aggregation": {
        None: "the KL term is aggregated as the surrogate is (loss_aggregation; ours)",
        "sequence_mean": "each completion's KL token mean, then the mean over completions, whatever the surrogate's "
        "aggregation (SkyRL: masked_mean(kl, mask, dim=-1).mean() beside a token-mean policy loss)",
        "sequence_sum": "each completion's KL token sum, then the mean over completions",
        "token_mean": "the KL summed over the batch's tokens, divided by their number (needs batch_loss)",
    },
    "logprob_truncation": {
        "renormalised": "under a top-k or top-p cut, a token's recorded and teacher-forced log-prob is its log-prob "
        "under softmax(logits / T) restricted to the cut and renormalised over it: the distribution sampled (ours; "
        "vLLM's logprobs_mode='processed_logprobs')",
        "ignored": "a token's log-prob is log softmax(logits / T) over the whole vocabulary, the cut deciding only "
        "what is drawn (TRL's trainer: logits / temperature, no top-k or top-p): the ratio's denominator is not the "
        "probability the token was drawn with, but engine and trainer agree",
    },
    "truncated_completions": {
        "kept": "a completion cut at max_tokens (no declared stop id at its end) is trained like any other (ours)",
        "masked": "a truncated completion is left out of the loss, its numerator and its normaliser alike (TRL's "
        "mask_truncated_completions=True, DAPO's overlong filtering); a completion that ends at any declared stop id "
        "is not truncated",
    },
    "kl_reference": {
        "base": "the KL penalty's reference is the base model, the adapter disabled, whatever adapter the run starts "
        "from (ours: a run starts from a zero-initialised adapter, which is the base)",
        "initial_adapter": "the reference is the adapter the trainer's first step starts from, kept frozen (TRL's "
        "'ref' adapter copied from a pretrained PEFT adapter): at step 0 the KL term is 0",
    },
    "step_normaliser": {
        "step": "when one generation batch feeds several optimizer steps, each step's loss is the declared aggregation "
        "over that step's own samples and tokens (ours: one step per generation batch, where the two agree)",
        "generation_mean": "each step is normalised as the generation batch's aggregation scaled to one step: by the "
        "generation batch's tokens (or samples) times gradient_accumulation_steps / steps_per_generation, the same "
        "for every step of it (TRL >= 1.9.1's dapo, cispo and vespo)",
    },
}

ADVANTAGE_FIELDS = (
    "advantage_scale",
    "advantage_baseline",
    "std_scope",
    "std_eps",
    "std_eps_placement",
    "singleton_groups",
    "advantage_dtype",
)
"""The fields the advantage laws read: the only ones their failure messages print."""

LOSS_FIELDS = (
    "loss_aggregation",
    "loss_normalizer",
    "kl_estimator",
    "kl_clamp",
    "kl_aggregation",
    "importance_ratio",
    "ratio_cap",
    "dual_clip",
    "loss_dtype",
)
"""The fields the loss laws read: the only ones their failure messages print."""


@dataclass(frozen=True)
class AlgorithmSpec:
    """The GRPO design choices of an implementation's advantages and loss. The defaults are ours.

    Bind it as `Implementation(..., algorithm=AlgorithmSpec(advantage_scale="sample_std", std_eps=1e-6))`, or
    return it from the `algorithm` fixture of a contract subclass. `AlgorithmSpec.choices()` lists every field's
    values and what each means; docs/conformance.md#declaring-your-choices-algorithmspec has them as a table, with the
    library each value comes from and the combinations that cannot be declared.

    Raises:
        ValueError: an unknown value (the message lists the choices), a negative or non-finite `std_eps`, or a
            `loss_normalizer` missing for "constant" or given for another aggregation (the message says what to set).
        TypeError: a field of the wrong type.
    """

    advantage_scale: AdvantageScale = "population_std"
    advantage_baseline: AdvantageBaseline = "group_mean"
    std_scope: StdScope = "group"
    std_eps: float = 1e-4
    std_eps_placement: StdEpsPlacement = "std"
    singleton_groups: SingletonGroups = "zero"
    advantage_dtype: AdvantageDtype = "float64"
    loss_aggregation: LossAggregation = "sequence_mean"
    loss_normalizer: float | None = None
    kl_estimator: KlEstimator = "k3"
    kl_clamp: float | None = None
    kl_aggregation: LossAggregation | None = None
    importance_ratio: ImportanceRatio = "clipped"
    ratio_cap: float | None = None
    dual_clip: float | None = None
    loss_dtype: LossDtype = "float64"
    logprob_truncation: LogprobTruncation = "renormalised"
    truncated_completions: TruncatedCompletions = "kept"
    kl_reference: KlReference = "base"
    step_normaliser: StepNormaliser = "step"

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
        self._check_combinations()

    def _check_combinations(self) -> None:
        _check_bound("ratio_cap", self.ratio_cap, above=0.0, meaning="the bound of CISPO's weight min(r, C)")
        if (self.importance_ratio == "cispo") != (self.ratio_cap is not None):
            raise ValueError(
                "AlgorithmSpec(importance_ratio='cispo') must declare ratio_cap=C, the bound of its weight "
                "min(r, C) (TRL's epsilon_high, e.g. ratio_cap=5.0), and ratio_cap is only used by it: got "
                f"importance_ratio={self.importance_ratio!r}, ratio_cap={self.ratio_cap!r}"
            )
        if self.importance_ratio == "sequence" and self.kl_estimator == "k3_ratio":
            raise ValueError(
                "AlgorithmSpec(importance_ratio='sequence', kl_estimator='k3_ratio') is not declarable: a sequence "
                "ratio weighting each token's k3 couples every token's gradient to the whole completion's KL. "
                "Declare the token-level ratio, or an unweighted estimator"
            )
        if self.kl_aggregation is not None and self.kl_estimator == "none":
            raise ValueError(
                "AlgorithmSpec(kl_aggregation=...) aggregates a KL penalty, and kl_estimator='none' "
                "declares none: drop kl_aggregation"
            )
        if self.std_scope == "batch" and (self.advantage_scale == "none" or self.advantage_baseline != "group_mean"):
            raise ValueError(
                "AlgorithmSpec(std_scope='batch') scales by the batch's std: it needs advantage_scale "
                "'population_std' or 'sample_std' and advantage_baseline='group_mean'"
            )

    def __repr__(self) -> str:
        return self.declared()

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        """Hypothesis prints a falsifying example's declaration as `declared()`, not field by field."""
        printer.text(self.declared())

    @classmethod
    def choices(cls) -> dict[str, dict[Any, str]]:
        """Every field with a fixed set of values: `{field: {value: what it means}}`."""
        return {name: dict(meanings) for name, meanings in _MEANING.items()}

    def declared(self, only: tuple[str, ...] | None = None) -> str:
        """The fields that differ from ours (of `only`, when given: `ADVANTAGE_FIELDS` or `LOSS_FIELDS`, what a law
        uses), as `AlgorithmSpec(...)` source: what a failure message shows."""
        default = AlgorithmSpec()
        changed = [
            f"{f.name}={getattr(self, f.name)!r}"
            for f in fields(self)
            if getattr(self, f.name) != getattr(default, f.name) and (only is None or f.name in only)
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
