"""Plant each catalogued bug (`catalogue.py`) in a copy of the repository and see who catches it: our `tests/`, and the
packaged conformance suite run as a fork runs it (from a directory outside the repo, against `IN_MEMORY` and
`REAL_CPU`).

    python scripts/mutants/run.py                       # every mutant; writes mutants.json and mutants.md in --out
    python scripts/mutants/run.py --only adv-eps-dropped,loss-kl-k1 --out /tmp/m
    python scripts/mutants/run.py --check               # only check every snippet applies (seconds)

Each mutant gets a fresh copy of HEAD's tree (`git archive`), so uncommitted edits are not measured. Every Python
process of a run gets `PYTHONPATH=<the mutated copy>`: that puts the copy ahead of an editable install's finder (which
maps `rl` to the checkout it was installed from), in the processes the tests spawn too. A sanity mutant that breaks
`import rl` runs first and must be killed on every side, or the run stops: a side that does not see it is not
importing the copy.

Outcomes per side: `killed` (a test failed), `timeout` (a hang: killed, reported as such), `error` (pytest could not
run, e.g. a collection error: killed, reported as such), `survived`. The kill rate is
|killed by the suite (IN_MEMORY or REAL_CPU) and by tests/| / |killed by tests/|.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from catalogue import CATALOGUE, Mutant  # noqa: E402

REPO = HERE.parent.parent
MARKERS = "not gpu and not slow and not ray and not browser and not flyte"
"""The `unit` session's selection (noxfile.py): what `tests/` means here."""
SKIP_TESTS = ("tests/test_mutants_catalogue.py",)
"""Checks the catalogue's snippets are in the tree: in a mutated copy one is not, by construction."""
IMPLS = {"in_memory": "rl.conformance.bindings.ours:IN_MEMORY", "real_cpu": "rl.conformance.bindings.ours:REAL_CPU"}
ENV = {"HYPOTHESIS_PROFILE": "dev", "HF_HUB_OFFLINE": "1", "PYTHONDONTWRITEBYTECODE": "1"}

SANITY = Mutant(
    "sanity-broken-import",
    "sanity",
    "rl/__init__.py",
    "__version__ = ",
    'raise RuntimeError("mutant sanity check: this copy of rl is broken on purpose")\n__version__ = ',
    "importing rl fails: every side must see it, or it is not importing the mutated copy",
)


class MutantError(RuntimeError):
    """A catalogue entry that does not apply: its snippet is missing, or occurs more than once."""


@dataclass
class Side:
    outcome: str  # killed | survived | timeout | error
    seconds: float
    stage: str = ""  # tests/: "hints" or "full"
    first_failure: str = ""

    @property
    def caught(self) -> bool:
        return self.outcome != "survived"


def apply(mutant: Mutant, root: Path) -> None:
    """Replace the mutant's snippet in `root`; raise MutantError unless it occurs exactly once."""
    if mutant.old == mutant.new:
        raise MutantError(f"{mutant.id}: old and new snippets are equal, so it changes nothing")
    path = root / mutant.file
    if not path.is_file():
        raise MutantError(f"{mutant.id}: {mutant.file} does not exist in {root}")
    text = path.read_text()
    count = text.count(mutant.old)
    if count != 1:
        raise MutantError(
            f"{mutant.id}: its snippet occurs {count} times in {mutant.file} (must be exactly once); "
            f"update scripts/mutants/catalogue.py to the current code:\n{mutant.old}"
        )
    path.write_text(text.replace(mutant.old, mutant.new, 1))


def copy_head(dest: Path) -> None:
    """HEAD's tracked files into `dest` (no .git, no build outputs, no uncommitted edits)."""
    archive = subprocess.run(["git", "-C", str(REPO), "archive", "HEAD"], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)


def _pytest(args: list[str], cwd: Path, copy: Path, timeout: float) -> tuple[int | None, str, float]:
    """Run `python -m pytest args` in `cwd` with the copy first on the path; (returncode or None on timeout, output)."""
    env = {**os.environ, **ENV, "PYTHONPATH": str(copy)}
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
        return proc.returncode, out, time.monotonic() - started
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the whole group: xdist workers and spawned ranks too
        out, _ = proc.communicate()
        return None, out, time.monotonic() - started


def _side(rc: int | None, out: str, seconds: float, stage: str = "") -> Side:
    failures = re.findall(r"^(?:FAILED|ERROR) (\S+)", out, flags=re.M)
    first = failures[0] if failures else ""
    if rc is None:
        return Side("timeout", seconds, stage, first or "(no test finished before the timeout)")
    if rc == 0:
        return Side("survived", seconds, stage)
    if rc == 1 or (rc == 2 and failures):
        # xdist under -x reports the first failure's stop as an interruption (exit 2): still a failed test.
        return Side("killed", seconds, stage, first)
    tail = " | ".join(line for line in out.strip().splitlines()[-3:])
    return Side("error", seconds, stage, first or f"pytest exit {rc}: {tail[-300:]}")


def run_tests(copy: Path, mutant: Mutant, timeout: float, workers: int) -> Side:
    """Our tests/: the mutant's hint files first (seconds), then, if they pass, the whole unit selection."""
    base = ["-x", "-q", "-p", "no:cacheprovider", "-m", MARKERS, *(f"--ignore={p}" for p in SKIP_TESTS)]
    started = time.monotonic()
    hints = [h for h in mutant.hints if (copy / h).exists()]
    if hints:
        rc, out, _ = _pytest([*hints, *base], copy, copy, timeout)
        side = _side(rc, out, time.monotonic() - started, "hints")
        if side.outcome != "survived":
            return side
    xdist = ["-n", str(workers)] if workers > 0 else []
    rc, out, _ = _pytest(["tests", *base, *xdist], copy, copy, timeout)
    return _side(rc, out, time.monotonic() - started, "full")


def run_suite(copy: Path, impl: str, timeout: float) -> Side:
    """The packaged suite as a fork runs it: from an empty directory outside the repository."""
    with tempfile.TemporaryDirectory(prefix="rl-mutant-suite-") as outside:
        args = ["--pyargs", "rl.conformance.test_suite", "--rl-impl", impl, "-x", "-q", "-p", "no:cacheprovider"]
        rc, out, seconds = _pytest(args, Path(outside), copy, timeout)
    return _side(rc, out, seconds)


def measure(mutant: Mutant, args: argparse.Namespace) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix=f"rl-mutant-{mutant.id}-") as tmp:
        copy = Path(tmp)
        copy_head(copy)
        apply(mutant, copy)
        sides = {"tests": run_tests(copy, mutant, args.tests_timeout, args.workers)}
        for name, impl in IMPLS.items():
            sides[f"suite_{name}"] = run_suite(copy, impl, args.suite_timeout)
    row: dict[str, object] = {"id": mutant.id, "tier": mutant.tier, "file": mutant.file, "models": mutant.models}
    row.update({name: asdict(side) for name, side in sides.items()})
    flags = " ".join(f"{name}={side.outcome}" for name, side in sides.items())
    print(f"[mutants] {mutant.id}: {flags}", flush=True)
    return row


def check_imports(copy: Path) -> None:
    """The copy's `rl` and `fakes` are what a process outside the repo imports with PYTHONPATH set."""
    code = "import importlib.util as u; print(u.find_spec('rl').origin); print(u.find_spec('fakes').origin)"
    with tempfile.TemporaryDirectory(prefix="rl-mutant-imports-") as outside:
        env = {**os.environ, **ENV, "PYTHONPATH": str(copy)}
        out = subprocess.run([sys.executable, "-c", code], cwd=outside, env=env, capture_output=True, text=True)
    origins = out.stdout.split()
    if len(origins) != 2 or not all(Path(o).resolve().is_relative_to(copy.resolve()) for o in origins):
        sys.exit(f"[mutants] rl/fakes resolve to {origins or out.stderr!r}, not the copy {copy}: fix the environment")


def kill_rates(rows: list[dict[str, object]]) -> dict[str, object]:
    def caught(row: dict[str, object], side: str) -> bool:
        outcome = row[side]["outcome"]  # type: ignore[index]
        return outcome != "survived"

    by_tests = [r for r in rows if caught(r, "tests")]
    rates: dict[str, object] = {"mutants": len(rows), "killed_by_tests": len(by_tests)}
    for label, sides in (
        ("suite", ("suite_in_memory", "suite_real_cpu")),
        ("suite_in_memory", ("suite_in_memory",)),
        ("suite_real_cpu", ("suite_real_cpu",)),
    ):
        both = [r for r in by_tests if any(caught(r, s) for s in sides)]
        rates[f"killed_by_{label}"] = sum(any(caught(r, s) for s in sides) for r in rows)
        rates[f"killed_by_{label}_and_tests"] = len(both)
        rates[f"rate_{label}"] = round(len(both) / len(by_tests), 4) if by_tests else None
    rates["gaps"] = [r["id"] for r in by_tests if not any(caught(r, s) for s in ("suite_in_memory", "suite_real_cpu"))]
    rates["suite_only"] = [
        r["id"]
        for r in rows
        if not caught(r, "tests") and any(caught(r, s) for s in ("suite_in_memory", "suite_real_cpu"))
    ]
    rates["survived_everything"] = [
        r["id"] for r in rows if not any(caught(r, s) for s in ("tests", "suite_in_memory", "suite_real_cpu"))
    ]
    return rates


def markdown(rows: list[dict[str, object]], rates: dict[str, object], command: str) -> str:
    def cell(side: dict[str, object]) -> str:
        outcome = str(side["outcome"])
        mark = {
            "killed": "killed",
            "survived": "**survived**",
            "timeout": "killed (timeout)",
            "error": "killed (error)",
        }
        return mark[outcome]

    lines = [
        "| mutant | tier | the fork's mistake | tests/ | suite IN_MEMORY | suite REAL_CPU |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(
            f"| `{r['id']}` | {r['tier']} | {r['models']} | {cell(r['tests'])} | {cell(r['suite_in_memory'])} | "  # type: ignore[arg-type]
            f"{cell(r['suite_real_cpu'])} |"  # type: ignore[arg-type]
        )
    rate = rates["rate_suite"]
    summary = [
        f"Command: `{command}`",
        "",
        f"- mutants: {rates['mutants']}; killed by tests/: {rates['killed_by_tests']}; by the suite (IN_MEMORY or "
        f"REAL_CPU): {rates['killed_by_suite']}",
        f"- kill rate |suite ∩ tests/| / |tests/|: {rates['killed_by_suite_and_tests']}/{rates['killed_by_tests']}"
        f" = {rate if rate is None else f'{100 * float(rate):.1f}%'} (IN_MEMORY alone {rates['rate_suite_in_memory']}, "  # type: ignore[arg-type]
        f"REAL_CPU alone {rates['rate_suite_real_cpu']})",
        f"- killed by tests/ but survived by the suite: {', '.join(f'`{g}`' for g in rates['gaps']) or 'none'}",  # type: ignore[attr-defined]
        f"- killed by the suite only: {', '.join(f'`{g}`' for g in rates['suite_only']) or 'none'}",  # type: ignore[attr-defined]
        f"- survived everything: {', '.join(f'`{g}`' for g in rates['survived_everything']) or 'none'}",  # type: ignore[attr-defined]
    ]
    return "\n".join([*summary, "", *lines, ""])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="", help="comma-separated mutant ids (default: the whole catalogue)")
    parser.add_argument("--jobs", type=int, default=1, help="mutants measured at once (default 1)")
    parser.add_argument("--workers", type=int, default=2, help="pytest-xdist workers for the full tests/ run (0: none)")
    parser.add_argument("--out", type=Path, default=Path("mutants-out"), help="directory for mutants.json and .md")
    parser.add_argument("--tests-timeout", type=float, default=900.0, help="seconds before tests/ counts as a hang")
    parser.add_argument("--suite-timeout", type=float, default=300.0, help="seconds before a suite run is a hang")
    parser.add_argument("--check", action="store_true", help="only check that every mutant applies, then exit")
    parser.add_argument("--no-sanity", action="store_true", help="skip the broken-import sanity mutant")
    args = parser.parse_args(argv)

    wanted = [i for i in args.only.split(",") if i]
    known = {m.id: m for m in CATALOGUE}
    unknown = [i for i in wanted if i not in known]
    if unknown:
        parser.error(f"unknown mutant ids {unknown}; known: {', '.join(known)}")
    mutants = [known[i] for i in wanted] if wanted else list(CATALOGUE)

    with tempfile.TemporaryDirectory(prefix="rl-mutant-check-") as tmp:
        copy_head(Path(tmp))
        for m in (*mutants, SANITY):
            original = (Path(tmp) / m.file).read_text()
            apply(m, Path(tmp))
            (Path(tmp) / m.file).write_text(original)
        check_imports(Path(tmp))
    print(f"[mutants] {len(mutants)} mutants apply cleanly to HEAD", flush=True)
    if args.check:
        return 0

    if not args.no_sanity:
        sanity = measure(SANITY, args)
        blind = [s for s in ("tests", "suite_in_memory", "suite_real_cpu") if sanity[s]["outcome"] == "survived"]  # type: ignore[index]
        if blind:
            sys.exit(f"[mutants] the sanity mutant survived on {blind}: those runs do not import the mutated copy")

    started = time.monotonic()
    command = "python scripts/mutants/run.py" + (f" --only {args.only}" if wanted else "")
    args.out.mkdir(parents=True, exist_ok=True)
    done: dict[str, dict[str, object]] = {}

    def write(final: bool) -> None:
        # After every mutant, so a long run interrupted midway still leaves what it measured.
        rows = [done[m.id] for m in mutants if m.id in done]
        rates = kill_rates(rows)
        doc = {
            "command": command,
            "complete": final and len(rows) == len(mutants),
            "seconds": round(time.monotonic() - started),
            "rates": rates,
            "mutants": rows,
        }
        (args.out / "mutants.json").write_text(json.dumps(doc, indent=2) + "\n")
        (args.out / "mutants.md").write_text(markdown(rows, rates, command))

    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = {pool.submit(measure, m, args): m for m in mutants}
        for future in concurrent.futures.as_completed(futures):
            done[futures[future].id] = future.result()
            write(final=False)
    write(final=True)
    print((args.out / "mutants.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
