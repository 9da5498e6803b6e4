"""`.ci/run`: every step carries a budget, the budgets fit CI's 45-minute target, and a step over its budget warns."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CI_RUN = (ROOT / ".ci" / "run").read_text()
STEP = re.compile(r"^step (\S+) (\S+) (.+)$", re.M)
TARGET_S = 45 * 60


def test_every_step_has_a_budget_and_together_they_fit_in_45_minutes():
    steps = STEP.findall(CI_RUN)
    assert len(steps) >= 10
    names = [name for _, name, _ in steps]
    assert len(names) == len(set(names)), "two steps share a name: their warnings would not say which grew"
    assert all(budget.isdigit() for budget, _, _ in steps), [b for b, _, _ in steps if not b.isdigit()]
    assert sum(int(budget) for budget, _, _ in steps) <= TARGET_S


def test_every_session_the_docs_say_ci_runs_is_a_step():
    table = (ROOT / "docs" / "nox-sessions.md").read_text()
    yes = re.findall(r"^\| `([\w-]+)` \|.*\| yes[^|]*\|$", table, flags=re.M)
    commands = " ".join(cmd for _, _, cmd in STEP.findall(CI_RUN))
    missing = [s for s in yes if s not in ("demo", "unit", "mindeps") and f"nox -s {s}" not in commands]
    assert yes and not missing, missing


def _step_function() -> str:
    start = CI_RUN.index("step() {")
    return CI_RUN[start : CI_RUN.index("\n}\n", start) + 3]


def test_a_step_over_its_budget_warns_naming_itself_and_one_within_it_does_not():
    script = "set -euo pipefail\ntimings=()\n" + _step_function() + "step 0 slowpoke sleep 1\nstep 100000 quick true\n"
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True)
    assert "WARNING: step 'slowpoke'" in done.stderr and "over its budget of 0 s" in done.stderr
    assert "quick" not in done.stderr
    assert "step 'quick' took" in done.stdout


def test_a_failing_step_fails_ci():
    script = "set -euo pipefail\ntimings=()\n" + _step_function() + "step 100 broken false\necho after\n"
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True)
    assert done.returncode != 0 and "after" not in done.stdout
