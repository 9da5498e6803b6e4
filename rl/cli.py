"""The `rl` command. Each sub-command lives in `rl/commands/<name>.py` and exposes `register(subparsers)`.

Sub-command modules import heavy libraries (torch, flyte) inside their handlers so `rl --help` stays fast.

A sub-command signals an expected failure by raising an `rl.errors.RlError` (or the filesystem's `OSError`); `main`
prints it as one line and returns its family's exit status (`rl.commands.failures`). `-v`/`--verbose`, accepted before
or after the sub-command, or `RL_TRACEBACK=1` adds the traceback for a bug report.
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
    "rl.commands.plan",
]


VERBOSE_HELP = "on a failure, print the traceback too (for a bug report; or set RL_TRACEBACK=1)"


def _add_verbose(parser: argparse.ArgumentParser, default: object) -> None:
    parser.add_argument("-v", "--verbose", action="store_true", default=default, help=VERBOSE_HELP)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in set(action.choices.values()):
                # SUPPRESS: a sub-command's default must not overwrite `rl -v COMMAND`'s True.
                _add_verbose(sub, argparse.SUPPRESS)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rl",
        description="GRPO + LoRA and durable agentic RL loops for Flyte 2: demos, chaos runs, benchmarks.",
        epilog="Exit status: 0 success, 1 a check failed, 2 bad input, 3-9 an rl.errors family, 10 the filesystem "
        "refused, 70 a bug (docs/commands.md: Exit status).",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_name in COMMAND_MODULES:
        importlib.import_module(module_name).register(subparsers)
    _add_verbose(parser, False)
    return parser


def _prog(args: argparse.Namespace) -> str:
    return " ".join(["rl", args.command, *([args.loop] if getattr(args, "loop", None) else [])])


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "func", None) is None:
        parser.print_help()
        return 0 if args.command is None else 2
    from rl.library_output import escaped_library_output

    try:
        with escaped_library_output():  # transformers' log names what a model directory holds: escaped
            return int(args.func(args) or 0)
    except (Exception, KeyboardInterrupt) as exc:
        from rl.commands.failures import report

        return report(exc, prog=_prog(args), verbose=args.verbose)


if __name__ == "__main__":
    sys.exit(main())
