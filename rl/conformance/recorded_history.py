"""The recorded history the replay law (`DriverReplayContract`) compares a driver against, and the command that records
one: by default the wheel's (`data/grpo_history.json`, recorded from `rl.loop.grpo.run_grpo`), or a fork's own,
recorded from its previous release and bound through the `recorded_history` fixture:

    python -m rl.conformance.recorded_history --driver my_pkg.loop:run_grpo --out tests/data/grpo_history.json
"""

from __future__ import annotations

import argparse
import importlib
import json
from collections import Counter
from dataclasses import asdict, dataclass
from importlib import resources
from typing import TYPE_CHECKING, Any

from rl.conformance.grpo_driver_contract import LAW_RUN_SHAPE, MODES
from rl.errors import HistoryFileError

if TYPE_CHECKING:
    from rl.loop.grpo import GrpoDriver

__all__ = [
    "HISTORY_SCHEMA",
    "RecordedHistory",
    "load_history",
    "record_history",
    "reference_history",
]

HISTORY_SCHEMA = 1
REFERENCE_FILE = "grpo_history.json"


@dataclass(frozen=True)
class RecordedHistory:
    """The actions one uninterrupted run issued, per mode, and the run shape that produced them.

    `actions[mode]` lists `(task, action_id)` in issue order; `config` is the `GrpoConfig` as a dict (minus `pipelined`,
    which the mode sets); `recorded_with` names the driver.
    """

    config: dict[str, Any]
    actions: dict[str, list[tuple[str, str]]]
    recorded_with: str
    schema: int = HISTORY_SCHEMA

    def to_json(self) -> str:
        """Pretty JSON with one action per line, so a re-recorded history diffs action by action."""
        head = {k: v for k, v in asdict(self).items() if k != "actions"}
        lines = [json.dumps(head, sort_keys=True, allow_nan=False)[:-1] + ', "actions": {']
        for m, (mode, actions) in enumerate(sorted(self.actions.items())):
            lines.append(f"  {json.dumps(mode, allow_nan=False)}: [")
            lines += [
                f"    {json.dumps(list(a), allow_nan=False)}" + ("," if i < len(actions) - 1 else "")
                for i, a in enumerate(actions)
            ]
            lines.append("  ]" + ("," if m < len(self.actions) - 1 else ""))
        return "\n".join([*lines, "}}"]) + "\n"


def _config(base: dict[str, Any], mode: str) -> Any:
    from rl.loop.grpo import GrpoConfig

    return GrpoConfig(**{**base, "pipelined": mode == "pipelined"})


def issued_actions(driver: GrpoDriver, config_dict: dict[str, Any], mode: str) -> list[tuple[str, str]]:
    """The `(task, action_id)` of every action `driver` issues in one uninterrupted simulated run of `config_dict`."""
    from rl.deploy.simulated.grpo_sim import grpo_sim

    config = _config(config_dict, mode)
    result = grpo_sim(config, seed=config.seed, driver=driver).run()
    if not result.ok:
        raise RuntimeError(f"the uninterrupted {mode} run failed: {type(result.error).__name__}: {result.error}")
    return [(a.task, a.action_id) for a in result.history]


def record_history(driver: GrpoDriver, *, recorded_with: str, config: dict[str, Any] | None = None) -> RecordedHistory:
    """Record `driver`'s actions in both modes on `config` (default: the driver laws' `LAW_RUN_SHAPE`, seed 0)."""
    shape = dict(config or {**LAW_RUN_SHAPE, "seed": 0})
    shape.pop("pipelined", None)
    return RecordedHistory(
        config=shape,
        actions={mode: issued_actions(driver, shape, mode) for mode in MODES},
        recorded_with=recorded_with,
    )


def load_history(text: str, *, source: str) -> RecordedHistory:
    """Parse a recorded-history file; `HistoryFileError` says what is wrong with it and how to re-record it."""
    try:
        raw = json.loads(text)
        schema = raw["schema"]
    except (ValueError, KeyError, TypeError) as exc:
        raise HistoryFileError(f"{source} is not a recorded history ({exc}); re-record it with {_RECORD_HINT}") from exc
    if schema != HISTORY_SCHEMA:
        raise HistoryFileError(
            f"{source} has history schema {schema!r}; this suite reads schema {HISTORY_SCHEMA}. Re-record it with "
            f"{_RECORD_HINT}"
        )
    missing = [m for m in MODES if m not in raw.get("actions", {})]
    if missing:
        raise HistoryFileError(f"{source} has no recorded actions for {missing}; re-record it with {_RECORD_HINT}")
    return RecordedHistory(
        config=dict(raw["config"]),
        actions={m: [(str(t), str(a)) for t, a in raw["actions"][m]] for m in MODES},
        recorded_with=str(raw.get("recorded_with", "?")),
        schema=schema,
    )


_RECORD_HINT = "python -m rl.conformance.recorded_history --driver MODULE:ATTR --out FILE"


def reference_history() -> RecordedHistory:
    """The history shipped in the wheel, recorded from `rl.loop.grpo.run_grpo`."""
    text = resources.files("rl.conformance").joinpath("data", REFERENCE_FILE).read_text()
    return load_history(text, source=f"rl/conformance/data/{REFERENCE_FILE}")


def replay_violations(recorded: list[tuple[str, str]], issued: list[tuple[str, str]]) -> list[str]:
    """Why a run recorded as `recorded` would not resume under a driver that issues `issued` (empty: it would)."""
    known = Counter(recorded)
    violations: list[str] = []
    for index, action in enumerate(issued):
        if known[action] > 0:
            known[action] -= 1
            continue
        task, action_id = action
        expected = recorded[index] if index < len(recorded) else None
        want = f"{expected[0]} ({expected[1]})" if expected else "no further action"
        violations.append(
            f"action #{index}: the driver issued {task} ({action_id}), which the recorded run does not have (the "
            f"record has {want} there); a recorded run would execute it again instead of replaying it"
        )
        break
    never = [f"{t} ({a})" for (t, a), n in known.items() for _ in range(n)]
    if never and not violations:
        violations.append(
            f"the driver never issued {len(never)} recorded action(s), first {never[0]}: its run differs from the "
            "recorded one"
        )
    return violations


def _main(argv: list[str] | None = None) -> None:
    from rl.argtypes import user_path

    parser = argparse.ArgumentParser(
        prog="python -m rl.conformance.recorded_history",
        description="Record the actions a GRPO driver issues, for the replay-compatibility law.",
    )
    parser.add_argument("--driver", default="rl.loop.grpo:run_grpo", help="MODULE:ATTR of the driver to record")
    parser.add_argument("--out", type=user_path, required=True, help="the JSON file to write")
    args = parser.parse_args(argv)
    module, _, attr = args.driver.partition(":")
    driver = getattr(importlib.import_module(module), attr)
    args.out.write_text(record_history(driver, recorded_with=args.driver).to_json())
    print(f"wrote {args.out}")


if __name__ == "__main__":
    _main()
