from __future__ import annotations

import subprocess
import sys

from rl.cli import main


def test_rl_help_lists_usage(capsys):
    """`rl --help` exits 0 and prints the program's usage."""
    try:
        main(["--help"])
    except SystemExit as exc:
        assert exc.code == 0
    assert "usage: rl" in capsys.readouterr().out


def test_rl_console_script_runs_without_heavy_imports():
    """The CLI entry point imports neither torch nor flyte just to print help."""
    code = "import sys; from rl.cli import build_parser; build_parser(); print(sorted({'torch','flyte'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"
