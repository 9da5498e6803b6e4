"""The lock holder's record is a file anyone could have written: a refusal shows its fields escaped and cut, through
`rl.errors.shown`, as docs/commands.md and docs/guarantees.md say of every value read from a run directory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rl.cli import main
from rl.errors import VALUE_CHARS
from rl.storage.run_lock import HOLDER_NAME, run_lock

LONG = 60_000


def test_a_60_kb_field_of_the_holders_record_is_cut_in_the_refusal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/guarantees.md: "A path or value read from a run directory reaches a terminal, a log or the report only
    through one escaping function (`rl.errors.shown`): control characters are shown as escapes, long values are cut."
    """
    run = tmp_path / "run"
    with run_lock(run, command="rl demo grpo"):  # held by this process: a second open of the lock is refused
        record = {"pid": 999, "host": "\x1b]0;pwned\x07", "command": "c" * LONG, "started": "today"}
        (run / HOLDER_NAME).write_text(json.dumps(record))
        rc = main(["demo", "grpo", "--iterations", "1", "--out", str(run)])
    err = capsys.readouterr().err
    [line] = [line for line in err.splitlines() if line.startswith("rl demo grpo:")]
    assert rc == 2 and "is being written by pid 999" in line
    assert len(line) < 4 * VALUE_CHARS, f"the refusal is {len(line)} characters long"
    assert f"{'c' * VALUE_CHARS}… ({LONG - VALUE_CHARS} more characters), since today)" in line
    assert "\x1b" not in err and "\\x1b]0;pwned\\x07" in line
