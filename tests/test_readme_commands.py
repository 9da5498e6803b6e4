"""The commands README.md and docs/ show are the commands CI runs (`.ci/readme_commands.py`); these checks fail in
seconds where CI would fail in minutes: a flag renamed, a sub-command without an example, a session a document names
but nox lacks."""

from __future__ import annotations

import ast
import importlib.util
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from rl.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / ".ci" / "readme_commands.py"


def _load():
    spec = importlib.util.spec_from_file_location("readme_commands", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


readme_commands = _load()
BLOCKS = readme_commands.readme_blocks()
RL_LINES = [line for line in BLOCKS["examples"].lines if line.startswith("rl ")]


def test_the_setup_block_is_the_two_commands_a_newcomer_types_with_the_demo_shrunk_through_posargs():
    assert BLOCKS["setup"].lines == ("pip install 'nox[uv]' && nox -s demo -- --iterations 3", "nox -s unit")


@pytest.mark.parametrize("line", RL_LINES)
def test_every_rl_example_line_parses_with_the_rl_command(line):
    """argparse exits 2 on an unknown flag, a missing argument or a bad choice: a README line that drifted from the
    CLI."""
    build_parser().parse_args(shlex.split(line)[1:])


def test_every_rl_sub_command_has_an_example_line():
    parser = build_parser()
    commands = parser._subparsers._group_actions[0].choices
    expected = set()
    for name, sub in commands.items():
        nested = [a for a in sub._actions if a.__class__.__name__ == "_SubParsersAction"]
        expected |= {f"{name} {loop}" for loop in nested[0].choices} if nested else {name}
    shown = {
        " ".join(shlex.split(line)[1:3]) if line.startswith("rl demo") else shlex.split(line)[1] for line in RL_LINES
    }
    assert expected <= shown, f"sub-commands without a README example line: {sorted(expected - shown)}"


def _nox_sessions() -> set[str]:
    """The sessions noxfile.py defines, by the name nox gives them (`@nox.session(name=...)`, else the function's)."""
    tree = ast.parse((ROOT / "noxfile.py").read_text())
    sessions = set()
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef):
            continue
        for d in node.decorator_list:
            if "nox.session" in ast.unparse(d):
                named = [k.value for k in getattr(d, "keywords", []) if k.arg == "name"]
                sessions.add(named[0].value if named and isinstance(named[0], ast.Constant) else node.name)
    return sessions


def test_the_readme_sessions_list_names_exactly_the_nox_sessions():
    """README keeps one short line per session; a session added or renamed without it fails here."""
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## nox sessions") :]
    listed = re.findall(r"^- `([\w-]+)`: ", section, flags=re.M)
    assert len(listed) == len(set(listed)) and set(listed) == _nox_sessions()


def test_the_docs_sessions_table_lists_exactly_the_nox_sessions():
    text = (ROOT / "docs" / "nox-sessions.md").read_text()
    table = text[text.index("| session") :]
    table = table[: table.index("\n\n")]
    listed = re.findall(r"^\| `([\w-]+)` \|", table, flags=re.M)
    assert len(listed) == len(set(listed)) and set(listed) == _nox_sessions()


def test_every_nox_session_the_documents_name_exists():
    documents = readme_commands.example_sources()
    text = "".join(path.read_text() for path in documents)
    named = set(re.findall(r"nox (?:-R )?-s ([\w-]+)", text))
    assert named and named <= _nox_sessions(), f"named but not in noxfile.py: {sorted(named - _nox_sessions())}"


def test_command_lines_of_every_docs_page_run_and_a_line_shown_twice_runs_once(tmp_path):
    """The commands that moved from README to docs/ pages are still the commands CI runs."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text("## Set up\n```bash\nnox -s unit\n```\n```bash\nrl plan --gpu L4\n```\n")
    (tmp_path / "docs" / "conformance.md").write_text("## Three commands\n```bash\npytest\n```\n")
    local, remote = (
        "flyte run --local rl/deploy/flyte/grpo.py train_rl   # local",
        "flyte run rl/deploy/flyte/grpo.py train_rl",
    )
    (tmp_path / "docs" / "flyte.md").write_text(f"# Cluster\n```bash\n{local}\n{remote}\n```\n")
    (tmp_path / "docs" / "chaos.md").write_text("# Chaos\n```bash\nrl chaos --seeds 1000\nrl plan --gpu L4\n```\n")
    examples = readme_commands.readme_blocks(tmp_path)["examples"].lines
    assert examples == ("rl plan --gpu L4", "rl chaos --seeds 5", "flyte run --local rl/deploy/flyte/grpo.py train_rl")


def test_shrinking_changes_sizes_only_and_fills_in_the_fork_placeholder():
    shrink = readme_commands.shrink
    assert (
        shrink("rl demo grpo --iterations 120 --seed 0 --out runs/x")
        == "rl demo grpo --iterations 3 --seed 0 --out runs/x"
    )
    assert shrink("rl chaos --loop grpo --seeds=1000") == "rl chaos --loop grpo --seeds=5"
    assert shrink("rl demo grpo --no-iterations-here") == "rl demo grpo --no-iterations-here"
    assert "rl.conformance.bindings.ours:IN_MEMORY" in shrink("pytest --rl-impl my_fork.conformance:IMPL -m rl_engine")


def test_extraction_keeps_quoted_hashes_and_drops_trailing_comments():
    blocks = readme_commands.bash_blocks(
        '## A\n```bash\nrl x --config \'{"a": "#1"}\'   # why\n\n# a comment line\n```\n```python\nrl no\n```\n'
    )
    assert blocks == [("A", ['rl x --config \'{"a": "#1"}\''])]


def test_a_renamed_heading_fails_loudly_instead_of_running_nothing(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text("## Setup\n```bash\nnox -s unit\n```\n")
    (tmp_path / "docs" / "conformance.md").write_text("## Three commands\n```bash\npytest\n```\n")
    with pytest.raises(SystemExit, match="Set up"):
        readme_commands.readme_blocks(tmp_path)


def test_the_runner_stops_at_the_first_failing_line_and_reports_its_block(tmp_path):
    """A block runs under `bash -euxo pipefail`: a failing line fails the block, and later lines never run."""
    marker = tmp_path / "ran"
    block = readme_commands.Block("t", "test", ("true", "false", f"touch {marker}"))
    assert readme_commands.run(block) != 0 and not marker.exists()
    code = subprocess.run([sys.executable, str(SCRIPT), "list"], capture_output=True, text=True, check=True)
    assert "nox -s demo -- --iterations 3" in code.stdout
