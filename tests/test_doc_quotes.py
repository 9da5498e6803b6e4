"""Tests that quote a document quote this repository's own: a test docstring that cites a file of docs/ (or the
README) by name, a colon and a quoted sentence names a file that exists and a sentence that is in it, so a test never
cites a promise the docs no longer make, or a document a reader cannot open."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CITATION = re.compile(r"((?:docs/[\w.-]+|README)\.md): (.*)", re.S)
QUOTE = re.compile(r'"([^"]+)"')


def _normal(text: str) -> str:
    return " ".join(text.split()).lower()


def _docstrings(path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Module)):
            doc = ast.get_docstring(node)
            if doc:
                found.append((getattr(node, "lineno", 1), doc))
    return found


def citations(root: Path) -> list[tuple[str, str, str]]:
    """(where, document, quoted text) for each quote in a test docstring that cites a document."""
    out = []
    for path in sorted(root.rglob("test_*.py")):
        for line, doc in _docstrings(path):
            match = CITATION.search(doc)
            if match:
                for quote in QUOTE.findall(match.group(2)):
                    out.append((f"{path.relative_to(root)}:{line}", match.group(1), quote))
    return out


CITED = citations(ROOT / "tests")


def test_tests_cite_the_guarantees() -> None:
    """The check has something to check: the chaos and simulator tests cite docs/guarantees.md."""
    assert sum(doc == "docs/guarantees.md" for _, doc, _ in CITED) >= 10


@pytest.mark.parametrize(("where", "document", "quote"), CITED, ids=[c[0] for c in CITED])
def test_a_quoted_sentence_is_in_the_document_it_names(where: str, document: str, quote: str) -> None:
    path = ROOT / document
    assert path.is_file(), f"{where} cites {document}, which is not in the repository"
    assert _normal(quote) in _normal(path.read_text()), f"{where} quotes {quote!r}, which {document} does not say"


def test_no_test_cites_a_document_outside_the_repository() -> None:
    """Design notes that live outside the repository (a `DESIGN:` or `STYLE:` file) are not a citation a reader can
    follow."""
    bad = [
        f"{path.relative_to(ROOT)}:{line}"
        for path in sorted((ROOT / "tests").rglob("*.py"))
        for line, doc in _docstrings(path)
        if re.match(r"(DESIGN|STYLE)\b", doc)
    ]
    assert not bad, f"cite docs/ or README.md instead: {bad}"


def test_a_misquote_is_caught(tmp_path: Path) -> None:
    (tmp_path / "test_x.py").write_text(
        'def test_a():\n    """docs/guarantees.md: "checkpoints are never written"."""\n'
    )
    [(_, document, quote)] = citations(tmp_path)
    assert document == "docs/guarantees.md"
    assert _normal(quote) not in _normal((ROOT / document).read_text())
