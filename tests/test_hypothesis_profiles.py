"""The `unit` hypothesis profile (fewer examples, what a bare `nox -s unit` runs) never reaches CI: `.ci/run` names a
profile before its first step and every profile it names is one tests/conftest.py registers (docs/benchmarks.md)."""

from __future__ import annotations

import re
from pathlib import Path

from hypothesis import settings

ROOT = Path(__file__).resolve().parents[1]
CI_RUN = (ROOT / ".ci" / "run").read_text()
NAMED = re.compile(r"HYPOTHESIS_PROFILE=(\w+)")


def test_ci_names_a_registered_profile_before_its_first_step_and_never_the_units():
    first_step = re.search(r"^step ", CI_RUN, flags=re.M)
    assert first_step is not None
    exported = re.findall(r"^export HYPOTHESIS_PROFILE=(\w+)$", CI_RUN[: first_step.start()], flags=re.M)
    assert exported, ".ci/run exports no HYPOTHESIS_PROFILE before its steps: its `nox -s unit` would run `unit`'s"
    named = NAMED.findall(CI_RUN)
    assert "unit" not in named
    for name in named:
        assert settings.get_profile(name).max_examples >= settings.get_profile("unit").max_examples, name
