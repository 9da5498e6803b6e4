"""The `rl` command. Each sub-command lives in `rl/commands/<name>.py` and exposes `register(subparsers)`.

Sub-command modules import heavy libraries (torch, flyte) inside their handlers so `rl --help` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# Modules that provide sub-commands, in the order `rl --help` lists them.
COMMAND_MODULES: list[str] = [
    "rl.commands.demo",
    "rl.commands.chaos",
    "rl.commands.rescore",
    "rl.commands.bench",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rl",
        description="GRPO + LoRA and durable agentic RL loops for Flyte 2: demos, chaos runs, benchmarks.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_name in COMMAND_MODULES:
        importlib.import_module(module_name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "func", None) is None:
        parser.print_help()
        return 0 if args.command is None else 2
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
