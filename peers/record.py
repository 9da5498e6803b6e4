"""The record of which conformance laws each peer binding fails (peers/expected.toml), and what a run observed.

`nox -s peers` reads the record (`load`), runs each binding's laws with a junit report, reads the report
(`junit_outcomes`) and fails when the two differ; `nox -s vllm-cpu` reads its reports the same way. The table of
recorded failures in docs/conformance.md is `markdown_table()`'s output, and tests/test_peer_record.py keeps it so.
Standard library only: the noxfile imports this before any virtualenv exists.
"""

from __future__ import annotations

import tomllib
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

EXPECTED = Path(__file__).with_name("expected.toml")


LAWS = "rl_advantages or rl_loss"
"""The laws a binding runs unless its record says `laws` (a `-m` expression): the advantage and loss laws."""


def load(path: Path = EXPECTED) -> dict[str, dict[str, Any]]:
    """`{peer: {"pin": "lib==X" or None, "fails": {binding: {law, ...}}, "why": {binding: reason}, "module":
    {binding: "peers.x"}, "laws": {binding: "-m expression"}}}`, in file order. A binding's module is
    `peers.<peer>_grpo` and its laws `LAWS` unless its record names others (`module`, `laws`)."""
    peers = {}
    for peer, entry in tomllib.loads(path.read_text()).items():
        bindings = {name: value for name, value in entry.items() if isinstance(value, dict)}
        peers[peer] = {
            "pin": entry.get("pin"),
            "fails": {name: set(binding["fails"]) for name, binding in bindings.items()},
            "why": {name: binding["why"] for name, binding in bindings.items()},
            "module": {name: binding.get("module", f"peers.{peer}_grpo") for name, binding in bindings.items()},
            "laws": {name: binding.get("laws", LAWS) for name, binding in bindings.items()},
        }
    return peers


def junit_outcomes(report: str) -> dict[str, str]:
    """`{Class::law: "passed" | "failed" | "skipped"}` from a pytest junit XML report."""
    outcomes = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        law = f"{case.get('classname', '').rpartition('.')[2]}::{case.get('name')}"
        if case.find("failure") is not None or case.find("error") is not None:
            outcomes[law] = "failed"
        elif case.find("skipped") is not None:
            outcomes[law] = "skipped"
        else:
            outcomes[law] = "passed"
    return outcomes


def markdown_table(peers: dict[str, dict[str, Any]] | None = None) -> str:
    """The record as docs/conformance.md shows it: one row per binding, its failing laws and why."""
    peers = load() if peers is None else peers
    rows = ["| binding | installed | fails | why |", "| --- | --- | --- | --- |"]
    for peer, spec in peers.items():
        for binding, fails in spec["fails"].items():
            laws = ", ".join(f"`{law.partition('::')[2]}`" for law in sorted(fails)) or "nothing"
            installed = f"`{spec['pin']}`" if spec["pin"] else "copied verbatim"
            module = spec.get("module", {}).get(binding, f"peers.{peer}_grpo")
            rows.append(f"| `{module}:{binding}` | {installed} | {laws} | {spec['why'][binding]} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(markdown_table())
