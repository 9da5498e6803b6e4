"""TRL PR #3029 (0.16.0): `GRPOTrainer._get_per_token_logps` divides the logits by the sampling temperature; 0.15.2
scored every token under softmax(logits) while vLLM or `generate` sampled at `GRPOConfig.temperature` (0.9 by default).

IMPL binds TRL's own method, unbound, on a bare object holding the one attribute it reads (`temperature`, which 0.15.2
ignores): the token log-prob law scores greedy completions of a tiny LM at T = 0.6 and under tempered top-k and top-p
cuts. TRL's trainer applies no cut, so the binding declares `logprob_truncation="ignored"`."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch
from trl.trainer.grpo_trainer import GRPOTrainer

from rl.conformance import AlgorithmSpec, Implementation


def token_logprobs(model: Any, prompts: Any, completions: Any, sampling: Any) -> torch.Tensor:
    """`GRPOTrainer._get_per_token_logps(model, input_ids, attention_mask, logits_to_keep)` on prompt + completion
    (equal lengths: no padding), with the trainer's `temperature` set to the sampling one."""
    trainer = SimpleNamespace(temperature=sampling.temperature)
    input_ids = torch.tensor([list(p) + list(c) for p, c in zip(prompts, completions, strict=True)], dtype=torch.long)
    attention_mask = torch.ones_like(input_ids)
    with torch.no_grad():
        return _GET_PER_TOKEN_LOGPS(trainer, model, input_ids, attention_mask, len(completions[0]))


# 0.16.0 wraps the method in `profiling_decorator` (it reads `self.args` and `self.accelerator` to log a timing);
# `__wrapped__` is TRL's own body, unchanged (functools.wraps). 0.15.2's is undecorated.
_GET_PER_TOKEN_LOGPS = getattr(GRPOTrainer._get_per_token_logps, "__wrapped__", GRPOTrainer._get_per_token_logps)


IMPL = Implementation(
    name="trl-pr3029",
    token_logprobs=token_logprobs,
    algorithm=AlgorithmSpec(logprob_truncation="ignored"),
)
