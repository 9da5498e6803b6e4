"""The commands README.md and docs/ show, read from the documents themselves and run as a user types them.

    python .ci/readme_commands.py list              # every block, as it will run
    python .ci/readme_commands.py run setup         # README's "Set up" block (from the repository root)
    python .ci/readme_commands.py run examples      # every `rl ...` and `--local` Flyte line of README.md and docs/*.md
    python .ci/readme_commands.py run conformance   # docs/conformance.md's three commands and options (`nox -s readme`)

A document edit that breaks a command fails CI, because CI runs what the document says, not a copy of it. A line
shown in two documents runs once. Sizes shrink
(`--iterations 120` -> 3, `--seeds 1000` -> 5, ...) and every other flag, default and path stays as written; the one
placeholder a fork fills in (`my_fork.conformance:IMPL`) is replaced by our own binding. Each block runs in one
`bash -euxo pipefail`, so a `cd` carries to the next line and every line is echoed before it runs.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Values that only make a command take longer: CI runs each command at this size. A flag missing here keeps its value.
SMALL = {"--iterations": "3", "--seeds": "5", "--world-gib": "0.01", "--steps": "2", "--rl-examples": "20"}
# The set-up block's demo takes its smaller size through the session's posargs, keeping its default --out.
SMALL_SESSIONS = {"nox -s demo": "nox -s demo -- --iterations 3"}
PLACEHOLDERS = {"my_fork.conformance:IMPL": "rl.conformance.bindings.ours:IN_MEMORY"}

_FENCE = re.compile(r"^```(\w*)\s*$")
_SHELLS = ("bash", "sh", "shell")


@dataclass(frozen=True)
class Block:
    name: str
    source: str
    lines: tuple[str, ...]


def bash_blocks(markdown: str) -> list[tuple[str, list[str]]]:
    """(heading, command lines) of every ```bash block, comments and blank lines dropped."""
    blocks: list[tuple[str, list[str]]] = []
    heading, lang, lines = "", None, []
    for raw in markdown.splitlines():
        fence = _FENCE.match(raw)
        if fence and lang is None:
            lang, lines = fence.group(1), []
        elif fence:
            if lang in _SHELLS:
                blocks.append((heading, lines))
            lang = None
        elif lang is None and raw.startswith("#"):
            heading = raw.lstrip("#").strip()
        elif lang in _SHELLS and (line := _strip_comment(raw).strip()):
            lines.append(line)
    return blocks


def _strip_comment(line: str) -> str:
    """The line without a trailing `# comment` (a `#` outside quotes, after whitespace)."""
    quote = ""
    for i, ch in enumerate(line):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i]
    return line


def shrink(line: str) -> str:
    for flag, small in SMALL.items():
        line = re.sub(rf"(?<!\S){re.escape(flag)}(=|\s+)\S+", rf"{flag}\g<1>{small}", line)
    for placeholder, ours in PLACEHOLDERS.items():
        line = line.replace(placeholder, ours)
    return line


def _under(blocks: list[tuple[str, list[str]]], heading: str, source: str) -> list[list[str]]:
    found = [lines for h, lines in blocks if h == heading]
    if not found:
        raise SystemExit(f"{source}: no ```bash block under the heading {heading!r}; update .ci/readme_commands.py")
    return found


def example_sources(root: Path = ROOT) -> list[Path]:
    """The documents whose `rl ...` and `--local` command lines run: README.md, then every page of docs/."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def readme_blocks(root: Path = ROOT) -> dict[str, Block]:
    readme = bash_blocks((root / "README.md").read_text())
    setup = []
    for line in _under(readme, "Set up", "README.md")[0]:  # the first block; the section's later ones are examples
        for session, small in SMALL_SESSIONS.items():
            line = re.sub(rf"{re.escape(session)}(?![\w-])", small, line)
        setup.append(line)
    examples: list[str] = []
    for source in example_sources(root):
        blocks = bash_blocks(source.read_text())
        examples += [shrink(line) for _, lines in blocks for line in lines if line.startswith("rl ")]
        local = [line for _, lines in blocks for line in lines if " --local" in line]
        examples += [line for line in local if line.split()[0] in ("flyte", "python")]  # Flyte's local mode
    examples = list(dict.fromkeys(examples))  # a line two documents show runs once
    docs = bash_blocks((root / "docs" / "conformance.md").read_text())
    conformance = [shrink(line) for lines in _under(docs, "Three commands", "docs/conformance.md") for line in lines]
    blocks = {
        "setup": Block("setup", "README.md, Set up", tuple(setup)),
        "examples": Block("examples", "README.md and docs/*.md, every `rl ...` and `--local` line", tuple(examples)),
        "conformance": Block("conformance", "docs/conformance.md, Three commands and More options", tuple(conformance)),
    }
    for block in blocks.values():
        if not block.lines:
            raise SystemExit(f"{block.source}: no commands found; update .ci/readme_commands.py")
    return blocks


def run(block: Block) -> int:
    print(f"readme_commands: {block.source}, from {ROOT}:", flush=True)
    script = "\n".join(block.lines)
    # Flyte's local mode leaves an empty flyte-tmp-* directory per file it stages: in a scratch TMPDIR, removed after.
    with tempfile.TemporaryDirectory(prefix="rl-readme-") as scratch:
        env = {**os.environ, "TMPDIR": scratch}
        return subprocess.run(["bash", "-euxo", "pipefail", "-c", script], cwd=ROOT, env=env).returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="action", required=True)
    sub.add_parser("list", help="print every block as it will run")
    runner = sub.add_parser("run", help="run blocks in order, stopping at the first failure")
    runner.add_argument("blocks", nargs="+", choices=("setup", "examples", "conformance"))
    args = parser.parse_args(argv)
    blocks = readme_blocks()
    if args.action == "list":
        for block in blocks.values():
            print(f"# {block.name}: {block.source}")
            print("\n".join(block.lines), end="\n\n")
        return 0
    for name in args.blocks:
        status = run(blocks[name])
        if status:
            print(f"readme_commands: the {name} block ({blocks[name].source}) failed with exit {status}", flush=True)
            return status
    return 0


if __name__ == "__main__":
    sys.exit(main())
