"""docs/conformance.md's law table is the laws' docstrings, rendered (`python -m rl.conformance.render_docs`), and the
conformance package is laid out by contract: each law module named after its class (import-linter's
laws-apart-from-bindings contract keeps our bindings apart)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import rl.conformance.test_suite as suite
from rl.conformance import render_docs

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "conformance.md"
PACKAGE = ROOT / "rl" / "conformance"
# Not laws: the public declarations, the entry module, the plugin and the renderer itself.
NOT_A_LAW_MODULE = {"__init__", "capabilities", "implementation", "plugin", "render_docs", "test_suite"}


def test_the_docs_law_table_is_the_docstrings_rendered() -> None:
    """Law: a changed docstring, law or contract changes the doc in the same commit."""
    text = DOC.read_text(encoding="utf-8")
    assert render_docs.rewrite(text) == text, (
        "run `python -m rl.conformance.render_docs` and commit docs/conformance.md"
    )


def test_the_table_lists_every_law_the_packaged_suite_collects() -> None:
    """Law: the renderer's contracts are the suite's: no bound law is missing from the doc, none listed twice."""
    collected = {
        law
        for name in dir(suite)
        if name.startswith("Test")
        for law in dir(getattr(suite, name))
        if law.startswith("test_")
    }
    rendered = [law for _, _, law, _ in render_docs.law_rows()]
    assert len(rendered) == len(set(rendered))
    assert set(rendered) == collected


def test_rewrite_refuses_a_doc_without_the_markers() -> None:
    with pytest.raises(ValueError, match="lacks the markers"):
        render_docs.rewrite("# a doc with no law table\n")


def test_the_check_flag_reports_a_stale_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = tmp_path / "conformance.md"
    doc.write_text(f"x\n{render_docs.BEGIN}\n| stale |\n{render_docs.END}\n", encoding="utf-8")
    assert render_docs.main(["--doc", str(doc), "--check"]) == 1
    assert "differs from the docstrings" in capsys.readouterr().out
    assert render_docs.main(["--doc", str(doc)]) == 0
    assert render_docs.main(["--doc", str(doc), "--check"]) == 0


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def test_each_law_module_is_named_after_a_class_it_defines() -> None:
    """Law: `DriverReplayContract` lives in driver_replay_contract.py, so a failing law's class names its file."""
    unnamed = []
    for path in sorted(PACKAGE.glob("*.py")):
        if path.stem in NOT_A_LAW_MODULE:
            continue
        classes = [n.name for n in ast.parse(path.read_text(encoding="utf-8")).body if isinstance(n, ast.ClassDef)]
        if path.stem not in {_snake(c) for c in classes}:
            unnamed.append(f"{path.name}: {classes}")
    assert unnamed == []
