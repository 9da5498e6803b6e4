"""How long the fast suite takes: `nox -R -s unit` (a warm virtualenv, nothing installed) timed end to end, then where
pytest's time went, summed per test file (setup, call and teardown of each test, across every worker).

A benchmark, not a test: it prints numbers (the goal is 30 s on a quiet 2-core machine, issue 51; docs/benchmarks.md
has the profile). Run it on a quiet machine:

    python scripts/bench_unit.py            # runs nox -R -s unit with a JUnit report, prints the wall time and files
    python scripts/bench_unit.py --top 40   # more files
    python scripts/bench_unit.py --report REPORT.xml   # only the per-file table of an existing JUnit report
"""

from __future__ import annotations

import argparse
import collections
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path


def per_file_seconds(report: Path) -> dict[str, float]:
    """Seconds per test file from a pytest JUnit report (pytest reports each test's setup + call + teardown)."""
    totals: collections.Counter[str] = collections.Counter()
    for case in ET.parse(report).getroot().iter("testcase"):
        module = case.get("classname", "").split(".")
        # classname is "tests.test_x" or "tests.test_x.TestClass": the file is the first test_ part.
        name = next((part for part in module if part.startswith("test_")), case.get("classname", "?"))
        totals[f"{name}.py"] += float(case.get("time", 0.0))
    return dict(totals)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--top", type=int, default=25, help="how many files to list (default 25)")
    parser.add_argument("--report", type=Path, help="summarise this JUnit report instead of running the suite")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rl-bench-unit-") as tmp:
        report = args.report or Path(tmp) / "unit.xml"
        if args.report is None:
            start = time.perf_counter()
            done = subprocess.run(["nox", "-R", "-s", "unit", "--", f"--junitxml={report}", "-q"], check=False)
            wall = time.perf_counter() - start
            print(f"nox -R -s unit: {wall:.1f} s wall, exit {done.returncode}")
            if done.returncode != 0:
                return done.returncode
        files = per_file_seconds(report)
    total = sum(files.values())
    print(f"{len(files)} files, {total:.1f} test-seconds summed over workers; the slowest {args.top}:")
    for name, seconds in sorted(files.items(), key=lambda kv: -kv[1])[: args.top]:
        print(f"{seconds:8.1f} s  {100 * seconds / total:5.1f} %  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
