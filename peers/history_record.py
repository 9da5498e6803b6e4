"""The record of released bugs found again (peers/history.toml, issue 47 section 3), and what a replay observed.

Each table of the record names a bug a public tracker reported and a release fixed: its report, the packaged law that
names it, the binding of the library's own code, the release before the fix and the release with it:

    [trl_pr3029]
    report = "https://github.com/huggingface/trl/pull/3029"
    title = "the trainer's log-probs computed without the sampling temperature"
    law = "TestTrainer::test_..."                # rl.conformance.test_suite's Class::test
    binding = "peers.history.trl_pr3029:IMPL"    # peers/history/trl_pr3029.py
    before = "trl==0.15.2"                       # the last release with the bug: fails the law
    after = "trl==0.16.0"                        # the first release with the fix: passes it
    with = ["transformers==4.49.0"]              # optional: pins both sides need
    why = "what the bug did, and how the law sees it"

`nox -s peers-history` reads it (`load`), replays each bug on both sides and fails when a side's outcome differs from
`EXPECTED` (`verdict`); docs/conformance.md's table is `markdown_table()`'s output, and tests/test_peer_history.py keeps
it so. Standard library only: the noxfile imports this before any virtualenv exists.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from peers.record import junit_outcomes

HISTORY = Path(__file__).with_name("history.toml")
REQUIRED = ("report", "title", "law", "binding", "before", "after", "why")
SIDES = ("before", "after")
EXPECTED = {"before": "failed", "after": "passed"}
"""A bug is found again when the release before its fix fails its law and the release with the fix passes it."""


class HistoryRecordError(ValueError):
    """peers/history.toml is malformed: the message names the bug and the field to fix."""


def load(path: Path = HISTORY) -> dict[str, dict[str, Any]]:
    """`{bug: {report, title, law, binding, before, after, with: [pins], why}}`, in file order; refuses a table that
    lacks a field, has an unknown one, or names a law or pin in the wrong shape."""
    bugs = {}
    for bug, entry in tomllib.loads(path.read_text()).items():
        if not isinstance(entry, dict):
            raise HistoryRecordError(f"{path.name}: `{bug}` is not a table; each bug is a [table] (history_record.py)")
        missing = [field for field in REQUIRED if not str(entry.get(field, "")).strip()]
        unknown = sorted(set(entry) - {*REQUIRED, "with"})
        if missing or unknown:
            raise HistoryRecordError(f"{path.name}: [{bug}] lacks {missing} / has unknown fields {unknown}")
        cls, sep, test = entry["law"].partition("::")
        if not (sep and cls.startswith("Test") and test.startswith("test_")):
            raise HistoryRecordError(f"{path.name}: [{bug}] law {entry['law']!r} is not `TestClass::test_name`")
        module, sep, attr = entry["binding"].partition(":")
        if not (sep and module.startswith("peers.history.") and attr):
            raise HistoryRecordError(f"{path.name}: [{bug}] binding {entry['binding']!r} is not peers.history.x:ATTR")
        pins = list(entry.get("with", []))
        for side in SIDES:
            if "==" not in entry[side]:
                raise HistoryRecordError(f"{path.name}: [{bug}] {side} = {entry[side]!r} is not an exact `lib==X` pin")
        bugs[bug] = {**entry, "with": pins}
    return bugs


def binding_path(spec: dict[str, Any], root: Path) -> Path:
    """The file of the module `spec["binding"]` names, under the repository `root`."""
    module = spec["binding"].partition(":")[0]
    return root.joinpath(*module.split(".")).with_suffix(".py")


def law_outcome(report: str, law: str) -> str:
    """`"passed"`, `"failed"` or why neither: the outcome of `law` (every parametrisation of it) in a junit report."""
    cls, _, test = law.partition("::")
    outcomes = [
        outcome
        for case, outcome in junit_outcomes(report).items()
        if case.partition("[")[0] == f"{cls}::{test}"  # test_x[param] is one case of test_x
    ]
    if not outcomes:
        return "not run (no such law collected)"
    if "failed" in outcomes:
        return "failed"
    if all(outcome == "passed" for outcome in outcomes):
        return "passed"
    return "skipped (the binding provides no tier for it)"


def verdict(bug: str, spec: dict[str, Any], outcomes: dict[str, str]) -> list[str]:
    """The differences between a replay's `{side: outcome}` and `EXPECTED`, each naming the bug and side; empty when
    the bug was found again."""
    return [
        f"{bug} ({spec['report']}): {side} ({spec[side]}) was expected to have {EXPECTED[side]} {spec['law']}, "
        f"but it {outcomes.get(side, 'did not run')}"
        for side in SIDES
        if outcomes.get(side) != EXPECTED[side]
    ]


def markdown_table(bugs: dict[str, dict[str, Any]] | None = None) -> str:
    """The record as docs/conformance.md shows it: report -> law -> verdict before and after."""
    bugs = load() if bugs is None else bugs
    rows = ["| report | bug | law | before | after |", "| --- | --- | --- | --- | --- |"]
    for bug, spec in bugs.items():
        link = f"[{bug}]({spec['report']})"
        law = f"`{spec['law'].partition('::')[2]}`"
        rows.append(f"| {link} | {spec['title']} | {law} | `{spec['before']}`: fails | `{spec['after']}`: passes |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(markdown_table())
