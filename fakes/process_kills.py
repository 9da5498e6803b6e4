"""Chaos with real processes: SIGKILL the CPU demo (`rl demo grpo`) at seeded moments, resume it, compare bit for bit.

The simulator proves resume at every await point of the driver's code; this proves it for the real process, whose
writes (checkpoint, adapter and optimizer artifacts, the rollout volume, `metrics.jsonl`) can be cut anywhere. For a
mode (sequential or pipelined):

1. run the demo uninterrupted into `WORK/run`, then move it to `WORK/reference` (the run directory's path is part of
   the checkpoint's artifact URIs, so both runs use the same path);
2. start the same command again and SIGKILL it after a delay drawn from the seed (uniform over the reference run's
   time from its artifact store appearing to its end: checkpoint, adapter, optimizer and volume writes; with
   `--base-build`, from its run directory appearing, so the base-model build is cut too), `kills` times; then run the
   command once more, to its end;
3. compare the final adapter and optimizer bytes, the checkpoint's state and `metrics.jsonl` with the reference's.

Only final equality is asserted: where a kill lands depends on this machine's speed, what must hold does not. The
per-phase timings (`phase_s`) are wall-clock seconds, left out of equality by design (`rl.types.IterationMetrics`), so
they and the checkpoint's digest over them are dropped before comparing. A command that exits non-zero without
being killed is a failure too (it must heal, or refuse with a message, never crash), reported with its stderr.

`python -m fakes.process_kills --iterations 3 --kills 4 --seed 0 [--pipelined]`; exit 0 when the runs are equal.
`--at volume-staged,checkpoint,...` kills exactly inside those writes instead (`fakes.kill_points`).
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

RL = "import sys; from rl.cli import main; sys.exit(main(sys.argv[1:]))"


@dataclass
class KillReport:
    mode: str
    seed: int
    kills: list[float] = field(default_factory=list)
    """When each process was SIGKILLed, in seconds after its run directory appeared (one that had ended is left out);
    at a kill point, the call it was killed at."""
    resumes: int = 0
    violations: list[str] = field(default_factory=list)


def demo_command(run_dir: Path, iterations: int, pipelined: bool) -> list[str]:
    mode = ["--pipelined"] if pipelined else []
    return [sys.executable, "-c", RL, "demo", "grpo", "--iterations", str(iterations), "--out", str(run_dir), *mode]


def _without_timings(value: Any) -> Any:
    """Drop the wall-clock `phase_s` everywhere in a JSON value."""
    if isinstance(value, dict):
        return {k: _without_timings(v) for k, v in value.items() if k != "phase_s"}
    if isinstance(value, list):
        return [_without_timings(v) for v in value]
    return value


def _artifact_bytes(run_dir: Path, ref: str) -> dict[str, bytes] | None:
    ref_file = run_dir / "artifacts" / "refs" / ref
    if not ref_file.exists():
        return None
    digest = ref_file.read_text().strip()
    objects = run_dir / "artifacts" / "objects" / digest.split(":", 1)[-1]
    files = {str(p.relative_to(objects)): p.read_bytes() for p in sorted(objects.rglob("*")) if p.is_file()}
    return {"ref": digest.encode(), **files}


def final_state_differences(reference: Path, run: Path, iterations: int) -> list[str]:
    """What differs between two finished demo run directories (empty when equal where it must be)."""
    problems: list[str] = []
    for ref in (f"adapter-v{iterations}", f"optimizer-v{iterations}"):
        want, got = _artifact_bytes(reference, ref), _artifact_bytes(run, ref)
        if got is None:
            problems.append(f"the killed run has no {ref}")
        elif got != want:
            problems.append(f"{ref} differs from the uninterrupted run's, byte for byte")
    for name in ("checkpoint.json", "metrics.jsonl"):
        if not (run / name).exists():
            problems.append(f"the killed run has no {name}")
            continue
        lines = [json.loads(line) for line in (run / name).read_text().splitlines() if line.strip()]
        want_lines = [json.loads(line) for line in (reference / name).read_text().splitlines() if line.strip()]
        if name == "checkpoint.json":  # its digest covers the timings; the loader checks it on every resume
            for blob in (*lines, *want_lines):
                blob.pop("digest", None)
        if _without_timings(lines) != _without_timings(want_lines):
            rows = [row.get("iteration") for row in lines] if name == "metrics.jsonl" else []
            detail = f" (iterations {rows})" if rows else ""
            problems.append(f"{name} differs from the uninterrupted run's{detail}")
    return problems


def _run(command: list[str], anchor: Path, delay_s: float | None) -> tuple[int | None, float, str]:
    """Run `command` to its end, or SIGKILL it `delay_s` after `anchor` appears (the process is past its imports).

    Returns (exit code, or None when killed; seconds from `anchor` appearing to the end; stderr).
    """
    with tempfile.TemporaryFile() as err:
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=err)
        while process.poll() is None and not anchor.exists():
            time.sleep(0.01)
        started = time.monotonic()
        try:
            process.wait(timeout=delay_s)
            code: int | None = process.returncode
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGKILL)
            process.wait()
            code = None
        err.seek(0)
        return code, time.monotonic() - started, err.read().decode(errors="replace")


def kill_chaos(
    work: Path, *, iterations: int, kills: int, seed: int, pipelined: bool, base_build: bool = False
) -> KillReport:
    """`base_build`: kills may land in the base-model build too (the delays count from the run directory appearing);
    without it they count from the artifact store appearing, after the build."""
    report = KillReport("pipelined" if pipelined else "sequential", seed)
    run_dir, reference = work / "run", work / "reference"
    anchor = run_dir if base_build else run_dir / "artifacts"
    command = demo_command(run_dir, iterations, pipelined)
    code, reference_s, err = _run(command, anchor, None)
    if code != 0:
        report.violations.append(f"the uninterrupted run failed (exit {code}): {err[-2000:]}")
        return report
    run_dir.rename(reference)
    rng = random.Random(seed)
    for _ in range(kills):
        code, elapsed, err = _run(command, anchor, rng.uniform(0.0, reference_s))
        if code is None:
            report.kills.append(round(elapsed, 2))
        elif code != 0:
            report.violations.append(f"a resumed run exited {code} without being killed: {err[-2000:]}")
            return report
    return _finish_and_compare(report, command, anchor, reference, run_dir, iterations)


def _finish_and_compare(
    report: KillReport, command: list[str], anchor: Path, reference: Path, run_dir: Path, iterations: int
) -> KillReport:
    """Run the plain demo `command` once more, to its end, and add what differs from the uninterrupted run."""
    report.resumes += 1
    code, _, err = _run(command, anchor, None)
    if code != 0:
        report.violations.append(f"the resume after the kills exited {code}: {err[-2000:]}")
        return report
    report.violations += final_state_differences(reference, run_dir, iterations)
    return report


def kill_point_chaos(work: Path, point: str, *, iterations: int, kills: int, seed: int, pipelined: bool) -> KillReport:
    """Like `kill_chaos`, but each kill lands exactly at the Nth call of a kill point (`fakes.kill_points`), N drawn
    from the seed over the calls an uninterrupted run makes; a resumed run that finishes before its Nth call is left
    to finish."""
    from fakes.kill_points import POINTS

    report = KillReport(f"{'pipelined' if pipelined else 'sequential'} at {point}", seed)
    run_dir, reference, count_file = work / "run", work / "reference", work / "calls"
    demo = demo_command(run_dir, iterations, pipelined)[3:]  # the rl arguments

    def command(nth: int) -> list[str]:
        bootstrap = "from fakes.kill_points import arm_and_run; arm_and_run()"
        return [sys.executable, "-c", bootstrap, point, str(nth), str(count_file), *demo]

    code, _, err = _run(command(0), run_dir, None)
    if code != 0:
        report.violations.append(f"the uninterrupted run failed (exit {code}): {err[-2000:]}")
        return report
    calls = int(count_file.read_text())
    if calls == 0:
        report.violations.append(f"an uninterrupted run never reached {point} ({POINTS[point].what})")
        return report
    run_dir.rename(reference)
    rng = random.Random(seed)
    for _ in range(kills):
        nth = rng.randint(1, calls)
        code, _, err = _run(command(nth), run_dir, None)
        if code == -signal.SIGKILL:
            report.kills.append(nth)
        elif code != 0:
            report.violations.append(f"a run armed at call {nth} exited {code} without being killed: {err[-2000:]}")
            return report
    return _finish_and_compare(
        report, demo_command(run_dir, iterations, pipelined), run_dir, reference, run_dir, iterations
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fakes.process_kills", description=__doc__.split("\n")[0])
    parser.add_argument("--iterations", type=int, default=3, help="demo iterations (default 3)")
    parser.add_argument("--kills", type=int, default=4, help="SIGKILLs per mode before the final resume (default 4)")
    parser.add_argument("--seed", type=int, default=0, help="draws the kill delays (default 0)")
    parser.add_argument("--pipelined", action="store_true", help="only the pipelined loop (default: both)")
    parser.add_argument("--sequential", action="store_true", help="only the sequential loop (default: both)")
    parser.add_argument(
        "--base-build",
        action="store_true",
        help="let kills land in the base-model build too (needs the atomic base-model build; fails before it)",
    )
    parser.add_argument(
        "--at",
        default="",
        help="comma-separated kill points (fakes.kill_points.POINTS: volume-staged, volume-published, checkpoint, "
        "artifact-staged, artifact-ref): kill exactly at a seeded call of each instead of after a random delay",
    )
    parser.add_argument("--jobs", type=int, default=1, help="cases (mode, kill point) run at once (default 1)")
    args = parser.parse_args(argv)
    modes = [m for m, on in ((False, args.sequential), (True, args.pipelined)) if on] or [False, True]
    points = [p for p in args.at.split(",") if p]
    from fakes.kill_points import POINTS

    unknown = [p for p in points if p not in POINTS]
    if unknown:
        parser.error(f"unknown kill point(s) {unknown}; choose from {', '.join(POINTS)}")
    cases = [(pipelined, point) for pipelined in modes for point in points or [None]]

    def run_case(case: tuple[bool, str | None]) -> KillReport:
        pipelined, point = case
        work = Path(tempfile.mkdtemp(prefix="rl-kill-chaos-"))
        try:
            if point is None:
                return kill_chaos(
                    work,
                    iterations=args.iterations,
                    kills=args.kills,
                    seed=args.seed,
                    pipelined=pipelined,
                    base_build=args.base_build,
                )
            return kill_point_chaos(
                work, point, iterations=args.iterations, kills=args.kills, seed=args.seed, pipelined=pipelined
            )
        finally:
            shutil.rmtree(work, ignore_errors=True)

    # Each case is its own run directory and processes (torch threads pinned inside), so cases run side by side;
    # reports print in case order.
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        reports = list(pool.map(run_case, cases))
    failed = False
    for (_, point), report in zip(cases, reports, strict=True):
        failed |= _print_report(report, args.seed, unit="call" if point else "s")
    return 1 if failed else 0


def _print_report(report: KillReport, seed: int, unit: str) -> bool:
    """Print a mode's verdict and violations; True when it failed."""
    verdict = "ok" if not report.violations else "FAILED"
    print(
        f"process kills {report.mode}: {verdict}: {len(report.kills)} SIGKILLs at {report.kills} {unit}, "
        f"{report.resumes} final resume(s), final state "
        + ("equal to the uninterrupted run's" if not report.violations else "checked")
    )
    for violation in report.violations:
        print(f"FAIL {report.mode} seed={seed}: {violation}")
    return bool(report.violations)


if __name__ == "__main__":
    sys.exit(main())
