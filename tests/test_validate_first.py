"""Issue 16 item 9: every input is checked before the first side effect. A count that cannot work is refused by
argparse (exit 2, nothing run); a configuration the demo cannot run is refused before `--fresh` deletes anything and
before the base model, artifacts or volumes are written."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rl.cli import main

# (command, a count flag, the smallest value that can work)
COUNT_FLAGS = [
    (["demo", "grpo"], "--iterations", 1),
    (["demo", "grpo"], "--prompts", 1),
    (["demo", "grpo"], "--samples", 2),
    (["demo", "agentic"], "--steps", 1),
    (["demo", "agentic"], "--worlds", 1),
    (["demo", "agentic"], "--prompts-per-step", 1),
    (["demo", "agentic"], "--samples", 1),
    (["demo", "agentic"], "--crash-driver-at-step", -1),
    (["chaos", "--loop", "grpo", "--no-sweep"], "--seeds", 1),
    (["chaos", "--loop", "grpo", "--no-sweep"], "--seed", 0),
]


def _usage_error(argv: list[str]) -> int:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    return exit_info.value.code


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_every_count_flag_refuses_a_value_below_its_minimum_at_parse_time(data, tmp_path_factory):
    """argparse refuses it (exit 2) before the handler runs, so no run directory appears."""
    command, flag, low = data.draw(st.sampled_from(COUNT_FLAGS), label="flag")
    value = data.draw(st.integers(min_value=low - 10**6, max_value=low - 1), label="value")
    out = tmp_path_factory.mktemp("out") / "run"
    extra = ["--out", str(out)] if command == ["demo", "grpo"] else []
    assert _usage_error([*command, flag, str(value), *extra]) == 2
    assert not out.exists()


def test_demo_iterations_zero_is_refused_before_anything_is_written(tmp_path, capsys):
    """Before: an error only after the run's set-up, with a base model, artifacts and volumes left in --out."""
    out = tmp_path / "run"
    assert _usage_error(["demo", "grpo", "--iterations", "0", "--out", str(out)]) == 2
    assert "--iterations: must be >= 1, got 0" in capsys.readouterr().err
    assert not out.exists()


def test_demo_config_is_checked_before_fresh_deletes_the_previous_run(tmp_path, capsys):
    """`--fresh` with a configuration that cannot run (more prompts per iteration than the task has) keeps --out."""
    out = tmp_path / "run"
    out.mkdir()
    (out / "keep.txt").write_text("previous run")
    assert main(["demo", "grpo", "--prompts", "500", "--fresh", "--out", str(out)]) == 2
    assert "prompts_per_iteration must be in [1, " in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["keep.txt"]


def test_local_grpo_refuses_a_config_before_building_the_base_model(tmp_path):
    """The library entry point checks too: nothing a run writes lands in the opened run directory for a config
    `run_grpo` would refuse (only its marker and lock, from opening it)."""
    from rl.deploy.local import local_grpo
    from rl.errors import InputError
    from rl.loop.grpo import GrpoConfig
    from rl.storage.run_dir import open_run
    from rl.storage.run_layout import written_by_run

    out = tmp_path / "run"
    with open_run(out, command="test") as run:
        with pytest.raises(InputError, match="iterations must be >= 1"):
            local_grpo(run, GrpoConfig(iterations=0))
        with pytest.raises(InputError, match="unknown reward 'bleu'"):
            local_grpo(run, GrpoConfig(iterations=1), reward="bleu")
    assert [p.name for p in out.iterdir() if written_by_run(p.name)] == []


def test_local_grpo_refuses_a_plain_path(tmp_path):
    """A path that no opener checked is refused before anything is read or written: the checks cannot be skipped."""
    from rl.deploy.local import local_grpo
    from rl.loop.grpo import GrpoConfig
    from rl.storage.run_dir import RunDir

    out = tmp_path / "run"
    with pytest.raises(TypeError, match="open_run"):
        local_grpo(out, GrpoConfig(iterations=1))
    with pytest.raises(TypeError, match="open_run"):
        RunDir(out, fresh=False, opener=object())
    assert not out.exists()


def test_agentic_demo_refuses_a_crash_step_beyond_the_run(capsys):
    """Before: `--crash-driver-at-step 3 --steps 3` ran without a crash and reported success."""
    assert main(["demo", "agentic", "--steps", "3", "--crash-driver-at-step", "3"]) == 2
    err = capsys.readouterr().err
    assert "--crash-driver-at-step 3 is beyond the run's 3 steps" in err and "Traceback" not in err


def test_bench_world_size_must_be_positive(capsys):
    assert _usage_error(["bench", "--sections", "volumes", "--world-gib", "0"]) == 2
    assert "--world-gib: must be a finite number > 0" in capsys.readouterr().err
