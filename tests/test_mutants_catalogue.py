"""The mutant catalogue (`scripts/mutants/catalogue.py`) cannot rot silently: every planted bug still applies to the
current `rl/`, exactly once, and the runner refuses one that does not."""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import replace
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MUTANTS = ROOT / "scripts" / "mutants"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, MUTANTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there; run.py imports catalogue by this name
    spec.loader.exec_module(module)
    return module


catalogue = _load("catalogue")
runner = _load("run")


@pytest.mark.parametrize("mutant", catalogue.CATALOGUE, ids=lambda m: m.id)
def test_every_mutant_snippet_occurs_exactly_once_in_production_code(mutant):
    assert mutant.file.startswith("rl/") and not mutant.file.startswith("rl/conformance/"), (
        f"{mutant.id} plants its bug in {mutant.file}; mutants belong in production code (rl/), not in fakes/ or the "
        "suite itself"
    )
    text = (ROOT / mutant.file).read_text()
    assert text.count(mutant.old) == 1, (
        f"{mutant.id}: its snippet occurs {text.count(mutant.old)} times in {mutant.file}; update the catalogue to "
        "the current code"
    )
    assert mutant.new != mutant.old and mutant.new.strip() != mutant.old.strip()
    assert mutant.tier in catalogue.TIERS
    assert all((ROOT / h).is_file() for h in mutant.hints), f"{mutant.id} hints at a test file that does not exist"


def test_the_catalogue_has_unique_ids_and_covers_every_tier():
    ids = [m.id for m in catalogue.CATALOGUE]
    assert len(ids) == len(set(ids)) and len(ids) >= 30
    assert {m.tier for m in catalogue.CATALOGUE} == set(catalogue.TIERS)


def test_the_runner_refuses_a_snippet_that_is_missing_or_ambiguous(tmp_path):
    mutant = catalogue.CATALOGUE[0]
    target = tmp_path / mutant.file
    target.parent.mkdir(parents=True)
    target.write_text("nothing to see\n")
    with pytest.raises(runner.MutantError, match="0 times"):
        runner.apply(mutant, tmp_path)
    target.write_text(f"{mutant.old}\n{mutant.old}\n")
    with pytest.raises(runner.MutantError, match="2 times"):
        runner.apply(mutant, tmp_path)
    target.write_text(f"a\n{mutant.old}\nb\n")
    runner.apply(mutant, tmp_path)
    assert target.read_text() == f"a\n{mutant.new}\nb\n"
    with pytest.raises(runner.MutantError, match="changes nothing"):
        runner.apply(replace(mutant, new=mutant.old), tmp_path)
