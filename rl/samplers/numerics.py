"""How far a policy's log-probs move between two precisions, and the first-step importance ratios that follow.

vLLM samples in bfloat16 and records those log-probs; the trainer recomputes them in float32. PPO's first-step ratio
exp(logp_new - logp_old) (GRPO: DeepSeekMath, eq. 3) is then not exactly 1, and a token whose ratio leaves the clip
range 1 +- clip_eps gets no gradient from rounding alone. `gpu_tests/test_bf16_logprobs.py` (a tiny model, its head
rescaled to a real model's logits, on a GPU) and `real_model_tests/test_bf16_logprobs.py` (SmolLM2 on the CPU) both
summarise their ratios with `ratio_spread`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch
from torch import nn

from rl.samplers.decoding import batched_teacher_forced_logprobs

__all__ = ["RatioSpread", "log_ratios", "ratio_spread"]


@dataclass(frozen=True)
class RatioSpread:
    """The ratios r = exp(log_ratio) of `tokens` tokens: their extremes, 1st and 99th percentiles (linear
    interpolation, `torch.quantile`'s default), the fraction with |r - 1| > clip_eps, and the mean and largest
    |log_ratio| (the log-probs' own disagreement, in nats)."""

    tokens: int
    min: float
    p01: float
    p99: float
    max: float
    clipped_fraction: float
    mean_abs_log_ratio: float
    max_abs_log_ratio: float

    def as_dict(self) -> dict[str, float]:
        return {k: float(v) for k, v in asdict(self).items()}


def ratio_spread(log_ratios: torch.Tensor, clip_eps: float) -> RatioSpread:
    """Summarise first-step ratios exp(`log_ratios`) against PPO's clip range 1 +- `clip_eps`.

    Shape: log_ratios [N] (any shape; flattened), N >= 1.
    """
    flat = log_ratios.detach().double().flatten().cpu()  # [N]
    if flat.numel() == 0:
        raise ValueError("no log-ratios to summarise: every completion was empty")
    ratios = flat.exp()  # [N]
    return RatioSpread(
        tokens=int(flat.numel()),
        min=float(ratios.min()),
        p01=float(ratios.quantile(0.01)),
        p99=float(ratios.quantile(0.99)),
        max=float(ratios.max()),
        clipped_fraction=float(((ratios - 1).abs() > clip_eps).double().mean()),
        mean_abs_log_ratio=float(flat.abs().mean()),
        max_abs_log_ratio=float(flat.abs().max()),
    )


@torch.no_grad()
def log_ratios(
    new: nn.Module,
    old: nn.Module,
    prompts: Sequence[Sequence[int]],
    completions: Sequence[Sequence[int]],
    *,
    pad_token_id: int,
) -> torch.Tensor:
    """log π_new(c_t) - log π_old(c_t) for every completion token, the pairs teacher-forced as one right-padded batch
    per model (`batched_teacher_forced_logprobs`: float32 log-softmax whatever the model's dtype, each on its own
    device), as the trainer scores them.

    Shape: B prompts [P_b], B completions [T_b] -> [sum_b T_b] (float64, on the CPU; row-major over the pairs).
    """
    new_logp, mask = batched_teacher_forced_logprobs(new, prompts, completions, pad_token_id)  # [B, T_max]
    old_logp, _ = batched_teacher_forced_logprobs(old, prompts, completions, pad_token_id)  # [B, T_max]
    delta = new_logp.double().cpu() - old_logp.double().cpu()  # [B, T_max]
    return delta[mask.cpu()]  # [sum_b T_b]
