"""`--fresh` deletes a previous run and nothing else: only in a directory this tool made, only what a run wrote."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from rl.cli import main
from rl.errors import FreshRefusedError

_DEMO = ["demo", "grpo", "--iterations", "1", "--prompts", "2", "--samples", "2", "--json"]


def _fresh_rc(out: str) -> int | None:
    try:
        return main([*_DEMO, "--out", out, "--fresh"])
    except FreshRefusedError as exc:
        assert "\n" not in str(exc) and "--out" in str(exc)  # one line that says what to do
        return None


@pytest.mark.parametrize("spelling", ["dir", "."])
def test_fresh_refuses_a_folder_of_someone_elses_files(tmp_path, monkeypatch, spelling):
    """`--fresh --out .` (or any folder this tool did not create) leaves every file where it was."""
    folder = tmp_path / "photos"
    (folder / "2024").mkdir(parents=True)
    (folder / "2024" / "beach.jpg").write_bytes(b"\xff\xd8")
    (folder / "checkpoint.json").write_text("{}")  # even a name a run writes is not ours without the marker
    monkeypatch.chdir(folder)
    rc = _fresh_rc(str(folder) if spelling == "dir" else ".")
    assert rc != 0
    assert sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*")) == [
        "2024",
        "2024/beach.jpg",
        "checkpoint.json",
    ]


@pytest.mark.heavy
def test_fresh_deletes_only_what_the_run_wrote_and_starts_over(tmp_path, capsys):
    """In a run directory this tool made, `--fresh` restarts the run and keeps a file the user put there."""
    out = tmp_path / "run"
    assert main([*_DEMO, "--out", str(out)]) == 0
    (out / "notes.txt").write_text("why I ran this")
    capsys.readouterr()
    assert main([*_DEMO, "--out", str(out), "--fresh"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["resumed_from"] == -1  # started over, not resumed
    assert (out / "notes.txt").read_text() == "why I ran this"


def test_fresh_unlinks_a_symlinked_entry_without_touching_what_it_points_at(tmp_path):
    """A run directory someone crafted: `--fresh` removes the link, never the files behind it."""
    from rl.storage.run_layout import claim, start_fresh

    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("keep")
    out = tmp_path / "run"
    claim(out)
    os.symlink(victim, out / "artifacts")
    (out / "checkpoint.json").write_text("{}")
    assert start_fresh(out) == ["artifacts", "checkpoint.json"]
    assert (victim / "keep.txt").read_text() == "keep" and sorted(os.listdir(out)) == [".rl-run"]


def test_fresh_refuses_an_out_that_is_a_file(tmp_path):
    """`--out` naming a file is not a run to start over; the file stays."""
    path = tmp_path / "report.pdf"
    path.write_bytes(b"%PDF")
    assert _fresh_rc(str(path)) != 0
    assert path.read_bytes() == b"%PDF"


def test_every_entry_a_run_layout_names_is_one_fresh_may_delete(tmp_path: Path) -> None:
    """Each path `RunLayout` gives a run's writers (and a base model's staging name) is an entry `--fresh` recognises,
    so a writer and `--fresh` cannot disagree on a name; a neighbour's file is not one."""
    from rl.storage.run_layout import RunLayout, written_by_run

    layout = RunLayout(tmp_path)
    base = layout.base_model("0123456789abcdef" * 4)
    paths = [layout.checkpoint, layout.metrics, layout.report, layout.artifacts, layout.volumes, base]
    assert all(p.parent == tmp_path and written_by_run(p.name) for p in paths)
    staging = RunLayout.base_staging(base)
    assert RunLayout.is_base_staging(staging.name) and written_by_run(staging.name)
    assert not RunLayout.is_base_staging(base.name) and not written_by_run("notes.txt")
