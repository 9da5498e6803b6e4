"""`--rl-seed` and `--rl-examples` reach hypothesis: another seed draws other data, more examples draw more, and seed 0
draws what it always drew (a fork's record of which laws it fails stays comparable across releases)."""

from __future__ import annotations

import pytest
import recording_advantages
from suite_runner import run_suite

pytest_plugins = ("pytester",)

LAW = "test_advantages_permuting_samples_permutes_advantages"


def drawn(pytester: pytest.Pytester, *options: str) -> list[tuple[tuple[int, ...], tuple[float, ...]]]:
    recording_advantages.SEEN.clear()
    run = run_suite(pytester, "recording_advantages:IMPL", "rl_advantages", "-k", LAW, *options)
    assert run.passed == {LAW}, run.reports
    return list(recording_advantages.SEEN)


def test_the_default_seed_draws_the_same_batches_every_run(pytester):
    assert drawn(pytester) == drawn(pytester)


def test_another_rl_seed_draws_other_batches_and_the_same_seed_the_same_ones(pytester):
    default, seven, seven_again = drawn(pytester), drawn(pytester, "--rl-seed", "7"), drawn(pytester, "--rl-seed", "7")
    assert seven == seven_again
    assert seven != default


@pytest.mark.heavy  # 60 examples of the law, ~1 CPU-s
def test_rl_examples_runs_that_many_draws(pytester):
    few, many = drawn(pytester), drawn(pytester, "--rl-examples", "60")
    assert len(set(many)) > 2 * len(set(few))


@pytest.mark.heavy
def test_a_seeded_run_leaves_the_laws_derandomized_for_the_next_run(pytester):
    before = drawn(pytester)
    drawn(pytester, "--rl-seed", "3", "--rl-examples", "5")
    assert drawn(pytester) == before
