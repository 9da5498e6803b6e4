"""`rl demo agentic`: the tutorial's failure table from the command line, and its JSON line."""

from __future__ import annotations

import argparse
import json

import pytest

from rl.commands.demo_agentic import add_agentic_demo

JSON_KEYS = {
    "trials_total",
    "trials_completed",
    "trial_retries",
    "judge_calls",
    "judge_retries",
    "train_steps",
    "trainer_ids",
    "driver_attempts",
    "mean_turns_by_step",
    "mean_reward_by_step",
}


def _demo(argv: list[str], capsys) -> tuple[int, str]:
    parser = argparse.ArgumentParser(prog="rl demo")
    add_agentic_demo(parser.add_subparsers(dest="demo"))
    args = parser.parse_args(["agentic", *argv])
    code = args.func(args)
    return code, capsys.readouterr().out


def test_the_failure_injected_demo_prints_the_seeds_table_and_ends_with_its_json(capsys):
    """Issue 6: "18 trials all completed, 18 judge calls, 3 train steps on one trainer identity, 2 driver attempts,
    mean turns falling"."""
    argv = ["--crash-driver-at-step", "1", "--flaky-trial-rate", "0.25", "--judge-flake-rate", "0.3", "--json"]
    code, out = _demo(argv, capsys)
    assert code == 0
    counts = json.loads(out.strip().splitlines()[-1])
    assert set(counts) >= JSON_KEYS
    assert counts["trials_total"] == counts["trials_completed"] == 18
    assert counts["judge_calls"] == 18 and counts["train_steps"] == 3 and len(counts["trainer_ids"]) == 1
    assert counts["driver_attempts"] == 2 and counts["trial_retries"] > 0 and counts["judge_retries"] > 0
    turns = counts["mean_turns_by_step"]
    assert turns == sorted(turns, reverse=True) and turns[0] > turns[-1] and len(counts["mean_reward_by_step"]) == 3
    for row in ("generate succeeded / retried", "train_step", "2 attempts", "mean turns", "seed=0"):
        assert row in out


def test_the_demo_takes_the_run_shape_from_its_flags(capsys):
    """`--steps 2 --worlds 1 --prompts-per-step 2 --samples 1` is 4 trials with no crash and one driver attempt."""
    argv = ["--steps", "2", "--worlds", "1", "--prompts-per-step", "2", "--samples", "1", "--seed", "9", "--json"]
    code, out = _demo(argv, capsys)
    counts = json.loads(out.strip().splitlines()[-1])
    assert code == 0 and counts["trials_total"] == 4 and counts["driver_attempts"] == 1 and counts["seed"] == 9


def test_the_demo_refuses_a_rate_outside_zero_one(capsys):
    """A typed error says what was wrong and what to do: rates are probabilities."""
    from rl.errors import InputError

    with pytest.raises(InputError, match=r"--flaky-trial-rate must be a probability in \[0, 1\]"):
        _demo(["--flaky-trial-rate", "1.5"], capsys)
