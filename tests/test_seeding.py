"""Laws of derived seeds: stable across processes, in range, distinct in practice, unambiguous in their encoding."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rl.seeding import (
    SEED_BITS,
    adapter_init_seed,
    derive_seed,
    eval_problem_seed,
    eval_seed,
    prompt_draw_seed,
    rollout_seed,
)

SEED_PARTS = st.one_of(st.integers(min_value=-(2**63), max_value=2**63), st.text(max_size=20))

# (arguments, seed) computed once with BLAKE2b; a change here changes the seed of every rollout of every run, so stored
# runs would no longer replay. Change the values only together with rl.seeding's version tag.
PINNED_ROLLOUT_SEEDS = [
    ((0, 0, 0), 1206581977),
    ((1, 2, 3), 342266126),
    ((2**31 - 1, 10**6, 4095), 460261725),
    ((-1, 0, 0), 594291398),
]

# The loop's seeds that put the run seed before their purpose (rl.seeding's docstring says why they stay so), computed
# by the driver's and evaluator's inline `derive_seed` calls before these functions existed: the demo's figures and
# every recorded run's prompts, initial adapter and evaluations depend on them.
PINNED_LOOP_SEEDS = [
    (prompt_draw_seed, (0, 0), 748866568),
    (prompt_draw_seed, (7, 3), 1207231282),
    (adapter_init_seed, (0,), 1886484497),
    (adapter_init_seed, (7,), 1520169595),
    (eval_seed, (0, 4), 1056708478),
    (eval_problem_seed, (123, 2), 1659562336),
]


@given(parts=st.lists(SEED_PARTS, min_size=1, max_size=6))
def test_derived_seeds_fit_in_a_signed_32_bit_int(parts):
    """Every derived seed lies in 0 .. 2**31 - 1, the range vLLM's seed and C-level RNGs accept."""
    seed = derive_seed(*parts)
    assert SEED_BITS <= 31
    assert 0 <= seed <= 2**31 - 1


@given(parts=st.lists(SEED_PARTS, min_size=1, max_size=6))
def test_derive_seed_is_a_pure_function_of_its_parts(parts):
    """Deriving twice from equal parts (a copy, not the same objects) gives the same seed."""
    assert derive_seed(*parts) == derive_seed(*json.loads(json.dumps(parts)))


@pytest.mark.parametrize(("args", "seed"), PINNED_ROLLOUT_SEEDS)
def test_rollout_seeds_are_pinned_across_versions_and_machines(args, seed):
    """rollout_seed returns the values it returned when written: nothing platform- or version-dependent feeds it."""
    assert rollout_seed(*args) == seed


@pytest.mark.parametrize(("fn", "args", "seed"), PINNED_LOOP_SEEDS)
def test_loop_seeds_are_pinned_across_versions(fn, args, seed):
    """The prompt-draw, initial-adapter and evaluation seeds return the values the driver derived before they moved
    into rl.seeding: moving them changed no run."""
    assert fn(*args) == seed


def test_rollout_and_derived_seeds_are_stable_across_processes():
    """Fresh interpreters with different hash salts (PYTHONHASHSEED) compute the same seeds as this process."""
    cases = [[r, i, g] for r in (0, 7) for i in (0, 3) for g in (0, 5)]
    labels = ["reward", "héllo", ""]
    code = (
        "import json, sys\n"
        "from rl.seeding import derive_seed, rollout_seed\n"
        "cases, labels = json.loads(sys.argv[1]), json.loads(sys.argv[2])\n"
        "print(json.dumps([[rollout_seed(*c) for c in cases], [derive_seed(s, 42) for s in labels]]))\n"
    )
    expected = [[rollout_seed(*c) for c in cases], [derive_seed(s, 42) for s in labels]]
    for salt in ("1", "2"):
        out = subprocess.run(
            [sys.executable, "-c", code, json.dumps(cases), json.dumps(labels)],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONHASHSEED": salt},
        ).stdout
        assert json.loads(out) == expected


def test_rollout_seeds_are_distinct_over_a_grid_of_runs_iterations_and_groups():
    """4 run seeds x 50 iterations x 16 groups give 3,200 distinct seeds (a chance collision here is ~0.2%, and the
    grid is fixed, so this pins that these particular seeds do not collide)."""
    grid = [(r, i, g) for r in range(4) for i in range(50) for g in range(16)]
    assert len({rollout_seed(*args) for args in grid}) == len(grid)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (("ab", "c"), ("a", "bc")),  # string boundaries are encoded
        ((1,), ("1",)),  # types are encoded
        ((12,), (1, 2)),  # integer boundaries are encoded
        ((1, 2), (2, 1)),  # positions matter
        ((0,), (0, 0)),  # the number of parts matters
        ((-1,), (1,)),  # signs matter
        (("",), ("", "")),  # empty strings still count
        (("rollout", 0, 0, 0), (0, 0, 0)),  # rollout seeds are namespaced
    ],
)
def test_look_alike_parts_give_distinct_seeds(a, b):
    """Part tuples that a naive concatenation would confuse derive different seeds."""
    assert derive_seed(*a) != derive_seed(*b)


def test_rollout_seed_is_namespaced_apart_from_other_uses_of_the_run_seed():
    """The rollout seed of (run, iteration, group) is not the seed another tier derives from the same three numbers."""
    assert rollout_seed(7, 3, 1) != derive_seed(7, 3, 1)


@pytest.mark.parametrize(("parts", "error"), [((), ValueError), ((True,), TypeError), ((1.0,), TypeError)])
def test_bad_seed_parts_raise(parts, error):
    """No parts raises ValueError; a bool or float part raises TypeError."""
    with pytest.raises(error):
        derive_seed(*parts)


@pytest.mark.parametrize("twin", [True, 1.0, [1]])
def test_a_bad_part_is_refused_even_after_its_equal_int_was_derived(twin):
    """derive_seed is memoised: a bool or float equal to an int already derived, or an unhashable part, still raises
    the TypeError naming the part, never the int's cached seed."""
    derive_seed("twin", 1)
    with pytest.raises(TypeError, match="must be an int or str"):
        derive_seed("twin", twin)
