"""The algorithm laws' names (public API: a fork selects and tracks them by name), grouped into invariants and choice
laws, and the one way the self-test runs them: the packaged suite against a binding, as a fork does."""

from __future__ import annotations

import pytest
from suite_runner import SuiteRun, run_suite

import rl.conformance.test_suite  # noqa: F401  (imported once here, so that each pytester run reuses it)

TIERS = "rl_advantages or rl_loss"

ALL_EQUAL = "test_advantages_of_an_all_equal_group_are_exactly_zero"
ZERO_SUM = "test_advantages_sum_to_zero_within_each_group"
RANK = "test_advantages_rank_samples_as_their_rewards_do"
PERMUTATION = "test_advantages_permuting_samples_permutes_advantages"
RELABEL = "test_advantages_relabelling_group_ids_changes_nothing"
INDEPENDENT = "test_advantages_of_a_group_do_not_depend_on_other_groups"
SCALE = "test_advantages_scale_as_declared"
SINGLETON = "test_advantages_of_a_singleton_group_follow_the_declared_convention"
ADVANTAGE_INVARIANTS = {ALL_EQUAL, ZERO_SUM, RANK, PERMUTATION, RELABEL, INDEPENDENT}
ADVANTAGE_CHOICES = {SCALE, SINGLETON}
ADVANTAGE_LAWS = ADVANTAGE_INVARIANTS | ADVANTAGE_CHOICES

REINFORCE = "test_loss_at_ratio_one_is_reinforce"
KL = "test_loss_kl_penalty_is_nonnegative_and_pulls_towards_the_reference"
CLIP = "test_loss_clip_caps_a_stale_samples_gain_on_both_sides_of_the_trust_region"
PADDING = "test_loss_ignores_padding_tokens"
SCALAR = "test_loss_is_a_finite_differentiable_scalar"
AGGREGATION = "test_loss_aggregates_tokens_as_declared"
KL_ESTIMATOR = "test_loss_kl_penalty_is_the_declared_estimator"
LOSS_INVARIANTS = {REINFORCE, KL, CLIP, PADDING, SCALAR}
LOSS_CHOICES = {AGGREGATION, KL_ESTIMATOR}
LOSS_LAWS = LOSS_INVARIANTS | LOSS_CHOICES


def run_algorithm_laws(pytester: pytest.Pytester, module: str, attr: str) -> SuiteRun:
    run = run_suite(pytester, f"{module}:{attr}", TIERS)
    assert not run.errors, f"{attr}: laws errored outside their bodies (a fixture or the binding broke): {run.errors}"
    return run
