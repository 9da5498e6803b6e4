"""The law behind a recorded sampling log-prob: each token is drawn from exactly the distribution whose log-prob is
recorded. A sampler that draws at another temperature (or top-p) but records the temperature-1 log-probs keeps every
teacher-forcing test green (both sides are temperature 1) and breaks only this, so it is checked directly: on a model
with fixed, peaked logits, the frequency of each token over many seeded rows matches exp(recorded log-prob)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import torch
from torch import nn

from rl.samplers.decoding import sample_groups

LOGITS = torch.tensor([3.0, 0.0, -1.0, 0.5])  # p(0) = 0.80 at temperature 1, 0.93 at 0.7
EOS = 3


class FixedLogits(nn.Module):
    """A causal LM stub whose next-token logits are `LOGITS` at every position."""

    def __init__(self) -> None:
        super().__init__()
        self.anchor = nn.Parameter(torch.zeros(1))

    def forward(self, input_ids: torch.Tensor, use_cache: bool = False, past_key_values: object = None) -> object:
        rows, length = input_ids.shape
        return SimpleNamespace(logits=LOGITS.expand(rows, length, -1).clone(), past_key_values=None)


def test_tokens_are_drawn_from_the_distribution_whose_log_probs_are_recorded() -> None:
    rows = 4000
    groups = sample_groups(
        FixedLogits(), [[1], [1]], ns=[rows // 2, rows // 2], max_tokens=1, seeds=[3, 4], eos_token_id=EOS
    )
    first = [seq.token_ids[0] for group in groups for seq in group]
    recorded = {seq.token_ids[0]: seq.logprobs[0] for group in groups for seq in group}
    expected = torch.log_softmax(LOGITS, dim=-1)
    for token, logprob in recorded.items():
        assert math.isclose(logprob, float(expected[token]), abs_tol=1e-6)
    for token in range(len(LOGITS)):
        p = math.exp(float(expected[token]))
        sigma = math.sqrt(p * (1 - p) / rows)
        frequency = first.count(token) / rows
        assert abs(frequency - p) < 5 * sigma, f"token {token}: drawn {frequency:.3f}, recorded p {p:.3f}"
