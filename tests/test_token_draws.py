"""The sampler's token draw (`rl.samplers.decoding.draw_tokens`): inverse CDF, one uniform a row from its group's
generator; it follows the distribution, never draws a token of zero mass, and refuses a distribution that is not one."""

from __future__ import annotations

import math

import pytest
import torch

from rl.errors import NonFiniteLogitsError
from rl.samplers.decoding import draw_tokens, tokens_at


def test_draws_follow_the_distribution() -> None:
    probs = torch.tensor([[0.5, 0.0, 0.3, 0.15, 0.05, 0.0]]).expand(20_000, -1)  # [N, V]
    drawn = draw_tokens(probs, [torch.Generator().manual_seed(3)], [0, probs.shape[0]]).squeeze(1)  # [N]
    counts = torch.bincount(drawn, minlength=6).double()
    expected = probs[0].double() * probs.shape[0]
    assert counts[1] == 0 and counts[5] == 0  # zero mass: never drawn
    for i in (0, 2, 3, 4):  # each count within 5 standard deviations of its binomial mean
        sd = math.sqrt(expected[i] * (1 - probs[0, i].item()))
        assert abs(counts[i] - expected[i]) < 5 * sd, (i, counts.tolist(), expected.tolist())


def test_unnormalised_rows_are_drawn_by_their_share() -> None:
    probs = torch.tensor([[2.0, 0.0, 6.0]]).expand(8_000, -1)  # total 8: token 2 has 3/4
    drawn = draw_tokens(probs, [torch.Generator().manual_seed(0)], [0, 8_000]).squeeze(1)
    assert int((drawn == 1).sum()) == 0
    assert abs(float((drawn == 2).double().mean()) - 0.75) < 5 * math.sqrt(0.75 * 0.25 / 8_000)


def test_a_share_at_the_edges_takes_a_token_of_nonzero_mass() -> None:
    probs = torch.tensor([[0.0, 0.25, 0.0, 0.75, 0.0, 0.0]] * 4)  # [4, V]
    cdf = probs.double().cumsum(-1)
    shares = torch.tensor([[0.0], [0.25], [1.0 - 1e-17], [1.0]], dtype=torch.float64)  # 1 - 1e-17 rounds to 1
    assert tokens_at(probs, cdf, shares).squeeze(1).tolist() == [1, 3, 3, 3]


def test_each_group_draws_from_its_own_generator() -> None:
    probs = torch.full((6, 50), 1.0)
    both = draw_tokens(probs, [torch.Generator().manual_seed(1), torch.Generator().manual_seed(2)], [0, 4, 6])
    alone = draw_tokens(probs[4:], [torch.Generator().manual_seed(2)], [0, 2])
    first = draw_tokens(probs[:4], [torch.Generator().manual_seed(1)], [0, 4])
    assert torch.equal(both, torch.cat([first, alone]))


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_a_distribution_that_is_not_one_is_refused(bad: float) -> None:
    probs = torch.tensor([[0.5, 0.5], [0.2, bad]])
    with pytest.raises(NonFiniteLogitsError, match="nothing was sampled"):
        draw_tokens(probs, [torch.Generator().manual_seed(0)], [0, 2])


def test_all_zero_mass_is_refused() -> None:
    with pytest.raises(NonFiniteLogitsError, match="all zero"):
        draw_tokens(torch.zeros(1, 4), [torch.Generator().manual_seed(0)], [0, 1])
