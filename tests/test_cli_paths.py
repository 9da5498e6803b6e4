"""Paths as a user types them: relative to the current directory, `~` expanded, spaces and non-ASCII names included.

The README's first command once crashed on its default relative `--out` while every test passed absolute temporary
paths; these tests run the CLI from a working directory of their own, with the paths a person would type.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rl.argtypes import user_path
from rl.cli import build_parser, main

TINY = ["--iterations", "1", "--prompts", "2", "--samples", "2", "--json"]


def _last_json(capsys) -> dict:
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_user_path_expands_home_and_anchors_a_relative_path_at_the_current_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "höme"))
    monkeypatch.chdir(tmp_path)
    assert user_path("~/runs/a b") == tmp_path / "höme" / "runs" / "a b"
    assert user_path("runs/démo x") == tmp_path / "runs" / "démo x"
    assert user_path(str(tmp_path / "abs")) == tmp_path / "abs"


@pytest.mark.parametrize(
    "argv", [["demo", "grpo"], ["demo", "grpo", "--out", "~/r"], ["rescore", "r", "--reward", "format"]]
)
def test_every_path_the_cli_parses_is_absolute(argv, tmp_path, monkeypatch):
    """The default `--out` too: argparse runs a string default through the same `type`."""
    monkeypatch.setenv("HOME", str(tmp_path))
    args = build_parser().parse_args(argv)
    path = args.out if argv[0] == "demo" else args.run_dir
    assert path.is_absolute() and "~" not in path.parts


@pytest.mark.heavy
def test_the_readme_demo_runs_with_its_default_out_and_resumes_and_rescores_from_other_directories(
    tmp_path, monkeypatch, capsys
):
    """`rl demo grpo` with the default relative `--out`, in a directory whose name has a space and non-ASCII letters;
    then the same run resumed through `~` from another directory, and re-scored through `..` from a third: the
    references stored in the run directory stay valid wherever the next command runs."""
    monkeypatch.setenv("HOME", str(tmp_path))
    work = tmp_path / "wörk dir"
    work.mkdir()
    monkeypatch.chdir(work)
    assert main(["demo", "grpo", *TINY]) == 0
    first = _last_json(capsys)
    run = work / "runs" / "demo-grpo"
    assert (run / "checkpoint.json").is_file() and (run / "report.html").is_file()
    assert Path(first["report"]) == run / "report.html"
    assert not (tmp_path / "runs").exists()  # nothing written relative to another directory

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert main(["demo", "grpo", "--out", "~/wörk dir/runs/demo-grpo", *TINY]) == 0
    second = _last_json(capsys)
    assert second["resumed_from"] == 0 and second["accuracy_last"] == first["accuracy_last"]
    assert not (elsewhere / "~").exists()

    third = tmp_path / "third"
    third.mkdir()
    monkeypatch.chdir(third)
    assert main(["rescore", "../wörk dir/runs/demo-grpo", "--reward", "format", "--json"]) == 0
    assert _last_json(capsys)["rollouts_rescored"] == 2 * 2  # one iteration of 2 prompts x 2 samples
