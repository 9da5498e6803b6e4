"""The generation-batch normaliser law: when one generation batch feeds several optimizer steps, each step's loss is
normalised as `AlgorithmSpec.step_normaliser` declares.

Why: a trainer that generates once and takes several optimizer steps on slices of the batch (TRL's
`steps_per_generation` beside `gradient_accumulation_steps`) must normalise each step by what it trains; a token mean
divided by the whole generation batch's tokens scales every step by G / S (TRL PR #6024), which the loss laws, one
function on one batch, cannot see. Bind `accumulated_loss`, `(micro_batches, *, gradient_accumulation_steps, clip_eps,
kl_beta) -> [loss per micro-batch]`: one generation batch as the trainer slices it, each micro-batch a `(new_logp,
old_logp, ref_logp, advantages, mask)` tuple; step k accumulates micro-batches k G .. k G + G - 1. Our loop trains each
generation batch in one step (it binds none). See docs/conformance.md#what-each-group-guards.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from rl.conformance.algorithm_spec import MACHINE_EPSILON, AlgorithmSpec
from rl.conformance.support.contract_base import ContractBase, must_provide, tier
from rl.conformance.support.reference import token_reference, token_weights

__all__ = ["AccumulatedLossFn", "GenerationBatchContract"]

AccumulatedLossFn = Callable[..., Sequence[Any]]

STEPS_PER_GENERATION = 4
"""Micro-batches in the law's generation batch."""
ACCUMULATIONS = (1, 2, 4)
"""Micro-batches per optimizer step: four steps, two, or one per generation batch."""
ROWS, WIDTH = 2, 5
CLIP_EPS = 0.2
RTOL = 1e-4


def _generation_batch(seed: int) -> list[tuple[list[list[float]], list[list[float]], list[float], list[int]]]:
    """Micro-batches of (new, old, advantages, lengths), completions of 1 to `WIDTH` tokens, ratios within 5% of 1
    (inside any trust region, where each token's loss is -r A)."""
    rng = random.Random(seed)
    batches = []
    for _ in range(STEPS_PER_GENERATION):
        new = [[rng.uniform(-3.0, -0.1) for _ in range(WIDTH)] for _ in range(ROWS)]
        old = [[x + rng.uniform(-0.05, 0.05) for x in row] for row in new]
        advantages = [rng.choice((-1.0, 1.0)) * rng.uniform(0.2, 1.5) for _ in range(ROWS)]
        lengths = [rng.randint(1, WIDTH) for _ in range(ROWS)]
        batches.append((new, old, advantages, lengths))
    return batches


@tier("generation_batch")
class GenerationBatchContract(ContractBase):
    """Provide `accumulated_loss` (module docstring) and, when your choices differ from ours, `algorithm`."""

    @pytest.fixture
    def accumulated_loss(self) -> AccumulatedLossFn:
        """Return `(micro_batches, *, gradient_accumulation_steps, clip_eps, kl_beta) -> [loss per micro-batch]`: your
        trainer's loss on each slice of one generation batch, scaled as it back-propagates it (module docstring)."""
        raise must_provide(
            "GenerationBatchContract",
            "accumulated_loss",
            "(micro_batches, *, gradient_accumulation_steps, clip_eps, kl_beta) -> the loss each micro-batch of one "
            "generation batch back-propagates",
        )

    @pytest.fixture
    def algorithm(self) -> AlgorithmSpec:
        """Return the `rl.conformance.AlgorithmSpec` your loss computes; the default is ours."""
        return AlgorithmSpec()

    @pytest.mark.parametrize("accumulation", ACCUMULATIONS)
    def test_each_optimizer_step_of_a_generation_batch_has_the_declared_normaliser(
        self, accumulated_loss: AccumulatedLossFn, algorithm: AlgorithmSpec, accumulation: int, rl_seed: int
    ) -> None:
        """A generation batch of 4 micro-batches trained in optimizer steps of `accumulation` micro-batches: each
        step's summed loss is the declared aggregation over that step's micro-batches alone (a token mean over the
        step's tokens, not the generation batch's)."""
        import torch

        if algorithm.importance_ratio == "cispo":
            pytest.skip(
                "CISPO's loss value is a convention (AlgorithmSpec.importance_ratio='cispo'): no value to check"
            )
        dtype = getattr(torch, algorithm.loss_dtype)
        drawn = _generation_batch(rl_seed)
        micro_batches = []
        for new, old, advantages, lengths in drawn:
            mask = [[t < n for t in range(WIDTH)] for n in lengths]
            new_t = torch.tensor(new, dtype=dtype)
            old_t = new_t if algorithm.importance_ratio == "on_policy" else torch.tensor(old, dtype=dtype)
            micro_batches.append(
                (
                    new_t,
                    old_t,
                    new_t.detach().clone(),
                    torch.tensor(advantages, dtype=dtype),
                    torch.tensor(mask, dtype=dtype),
                )
            )
        losses = list(
            accumulated_loss(micro_batches, gradient_accumulation_steps=accumulation, clip_eps=CLIP_EPS, kl_beta=0.0)
        )
        assert len(losses) == len(micro_batches), (
            f"accumulated_loss returned {len(losses)} losses for {len(micro_batches)} micro-batches; return one each"
        )
        tolerance = max(RTOL, 64 * MACHINE_EPSILON[algorithm.loss_dtype])
        for step in range(STEPS_PER_GENERATION // accumulation):
            window = range(step * accumulation, (step + 1) * accumulation)
            rows = [(drawn[m], r) for m in window for r in range(ROWS)]
            if algorithm.step_normaliser == "step":
                weights = token_weights(algorithm, [d[3][r] for d, r in rows])
            else:  # the generation batch's weights, scaled to one of its STEPS_PER_GENERATION / accumulation steps
                every = token_weights(algorithm, [n for d in drawn for n in d[3]])
                weights = [
                    every[m * ROWS + r] * STEPS_PER_GENERATION / accumulation for m in window for r in range(ROWS)
                ]
            expected = size = 0.0
            for ((new, old, advantages, lengths), r), w in zip(rows, weights, strict=True):
                for t in range(lengths[r]):
                    o = new[r][t] if algorithm.importance_ratio == "on_policy" else old[r][t]
                    token = token_reference(algorithm, new[r][t], o, new[r][t], advantages[r], CLIP_EPS, 0.0)
                    expected += w * token.value
                    size += abs(w) * (token.magnitude + abs(token.value))
            got = float(sum(float(losses[m]) for m in window))
            assert abs(got - expected) <= tolerance * size, (
                f"optimizer step {step} of a generation batch of {STEPS_PER_GENERATION} micro-batches, {accumulation} "
                f"per step, back-propagated {got!r}; {algorithm.declared()} gives {expected!r} (ratio "
                f"{got / expected if expected else float('nan'):.4g}). The step is normalised by another batch than "
                "the declared one: a token mean over the whole generation batch's tokens scales each step by "
                "gradient_accumulation_steps / steps_per_generation. Normalise by the step's own tokens (or samples), "
                "or declare step_normaliser='generation_mean' and scale the generation batch's count to one step"
            )
