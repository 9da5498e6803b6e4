"""No docstring in rl/ runs past 12 lines: a docstring states the contract, and tutorials and design notes live in
docs/, where a reader looks for them (issue 41). The packaged suite's law docs are exempt: in rl/conformance, a law
(`test_*`) and a law class (`*Contract`, `*Laws`, `Test*`) are the documentation a fork reads when one fails."""

from __future__ import annotations

import ast
from pathlib import Path

from parsed_sources import walked

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 12
DEFS = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


def _is_law_doc(path: Path, node: ast.AST) -> bool:
    if path.parent.name != "conformance" or path.parent.parent.name != "rl":
        return False
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return node.name.startswith("test_")
    if isinstance(node, ast.ClassDef):
        return node.name.startswith("Test") or node.name.endswith(("Contract", "Laws"))
    return False


def long_docstrings(root: Path) -> list[str]:
    """`path:line name (N lines)` for each docstring under `root` over MAX_LINES lines, law docs excepted."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in walked(path):
            if not isinstance(node, DEFS) or _is_law_doc(path, node):
                continue
            doc = ast.get_docstring(node)
            if doc and len(doc.splitlines()) > MAX_LINES:
                name = getattr(node, "name", "<module>")
                where = f"{path.relative_to(root.parent)}:{getattr(node, 'lineno', 1)}"
                found.append(f"{where} {name} ({len(doc.splitlines())} lines)")
    return found


def test_no_docstring_in_rl_runs_past_12_lines() -> None:
    long = long_docstrings(ROOT / "rl")
    assert not long, (
        f"{len(long)} docstring(s) over {MAX_LINES} lines; keep the contract (what, args, raises, shape) and move "
        "the tutorial or design prose to docs/, leaving a pointer (`See docs/conformance.md#...`):\n  "
        + "\n  ".join(long)
    )


def test_a_long_docstring_is_named_and_a_law_doc_is_exempt(tmp_path: Path) -> None:
    long = '"""' + "line\n" * 13 + '"""\n'
    (tmp_path / "rl" / "conformance").mkdir(parents=True)
    (tmp_path / "rl" / "mod.py").write_text(f"def f():\n    {long}")
    (tmp_path / "rl" / "conformance" / "laws.py").write_text(
        f"class EngineContract:\n    {long}\n    def test_a(self):\n        {long}\n\ndef helper():\n    {long}"
    )
    found = [where.split(":")[0] + " " + where.split(" ", 1)[1] for where in long_docstrings(tmp_path / "rl")]
    assert found == ["rl/conformance/laws.py helper (13 lines)", "rl/mod.py f (13 lines)"]
