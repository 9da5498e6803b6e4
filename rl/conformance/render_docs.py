"""docs/conformance.md's table of every law, rendered from the laws' docstrings: each law's reason is written once, in
its docstring, and the doc shows it. Rewrite the table after changing a law (tests/test_conformance_docs.py fails
while the doc and the docstrings differ):

    python -m rl.conformance.render_docs [--check] [--doc docs/conformance.md]
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import sys
from pathlib import Path

__all__ = ["BEGIN", "CONTRACTS", "END", "law_rows", "render_table", "rewrite"]

BEGIN = "<!-- laws: rendered by python -m rl.conformance.render_docs; edit the docstrings, not this table -->"
END = "<!-- laws: end -->"

# The contracts the packaged suite binds, in its order: (module under rl.conformance, class). Their mixins' laws come
# with them, under the class that defines each law.
CONTRACTS = (
    ("advantage_contract", "AdvantageContract"),
    ("loss_contract", "LossContract"),
    ("ddp_shard_step_contract", "DdpShardStepContract"),
    ("artifacts_contract", "ArtifactsContract"),
    ("state_store_contract", "StateStoreContract"),
    ("rollout_engine_contract", "RolloutEngineContract"),
    ("scorer_contract", "ScorerContract"),
    ("scoring_utilities_contract", "ScoringUtilitiesContract"),
    ("trainer_contract", "TrainerContract"),
    ("grpo_driver_contract", "GrpoDriverContract"),
    ("driver_replay_contract", "DriverReplayContract"),
    ("agentic_contract", "AgenticContract"),
    ("volume_store_contract", "VolumeStoreContract"),
    ("rollout_buffer_contract", "RolloutBufferContract"),
    ("token_logprob_contract", "TokenLogprobContract"),
    ("generation_batch_contract", "GenerationBatchContract"),
    ("batch_reward_scorer_contract", "BatchRewardScorerContract"),
    ("rollout_buffer_reads_contract", "RolloutBufferReadsContract"),
)


def _contract(module: str, name: str) -> type:
    cls: type = getattr(importlib.import_module(f"rl.conformance.{module}"), name)
    return cls


def law_rows() -> list[tuple[str, str, str, str]]:
    """(defining class, its markers, law, docstring on one line) for every law, each once, in the suite's order."""
    rows: list[tuple[str, str, str, str]] = []
    seen: set[str] = set()
    for module, name in CONTRACTS:
        contract = _contract(module, name)
        for owner in contract.__mro__:  # the class, then its mixins: the order pytest collects them in
            for law, value in vars(owner).items():
                if not law.startswith("test_") or law in seen:
                    continue
                seen.add(law)
                marks = [m.name for m in getattr(value, "pytestmark", []) if m.name.startswith("rl_")]
                marks = [m for m in marks if m != "rl_conformance"]
                doc = " ".join((inspect.getdoc(value) or "").split())
                if not doc:
                    raise ValueError(f"{owner.__name__}.{law} has no docstring: a law's reason is written in it")
                rows.append((owner.__name__, ", ".join(f"`{m}`" for m in marks), law, doc))
    return rows


def render_table() -> str:
    """The markdown table, between its markers."""
    lines = [BEGIN, "", "| class (marker) | law | why: its docstring |", "| --- | --- | --- |"]
    previous = None
    for owner, marks, law, doc in law_rows():
        head = f"`{owner}` ({marks})" if owner != previous else ""
        previous = owner
        lines.append(f"| {head} | `{law}` | {doc.replace('|', chr(92) + '|')} |")
    return "\n".join([*lines, "", END])


def rewrite(text: str) -> str:
    """`text` (the doc) with the table between its markers rendered anew; a ValueError if the markers are missing."""
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"the doc lacks the markers {BEGIN!r} ... {END!r} the law table is rendered between")
    return text[:start] + render_table() + text[end + len(END) :]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rl.conformance.render_docs", description=__doc__.split("\n")[0])
    parser.add_argument("--doc", type=Path, default=Path("docs/conformance.md"), help="the doc to rewrite")
    parser.add_argument("--check", action="store_true", help="only say whether the doc's table is current")
    args = parser.parse_args(argv)
    text = args.doc.read_text(encoding="utf-8")
    rendered = rewrite(text)
    if args.check:
        if rendered != text:
            print(f"{args.doc}: the law table differs from the docstrings; run python -m rl.conformance.render_docs")
            return 1
        return 0
    args.doc.write_text(rendered, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
