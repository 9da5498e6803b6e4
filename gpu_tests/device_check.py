"""The device check: the torch-only GPU tests on the machine this project may be lent (one H100 80 GB by default, or
one H200; no network at all; Python 3.12 with torch 2.11+cu130, transformers, peft, accelerate, safetensors, pytest,
psutil; no pydantic, Flyte or vLLM), in at most 5 minutes, with a short report in a folder the caller names.

    scripts/gpu/device_wheels.sh                 # here, once: pydantic's and Flyte's wheels into .device-wheels/
    python3 gpu_tests/device_check.py --wheels .device-wheels --out DIR      # there, with .device-wheels carried

It installs nothing from the network: the carried wheels the machine lacks are unpacked into a temporary folder (no
index, no pip), the machine's own torch is the one tested, and the package runs from this checkout. It runs `gpu_tests
-m "gpu and not vllm"` under RL_GPU_STRICT=1 (the CUDA trainer tests, the bf16 ratios, production's clustered step on
NCCL, the one-GPU NCCL step, the real-size configuration) within `--budget-s` (270 s by default, preflight included),
and lists every vLLM test as not run (vLLM's wheel is over 300 MB; 64 MiB travel). Each test's outcome is logged as it
finishes, so a run cut at the budget still reports the tests that passed; everything pytest started (torchrun's
workers in their own sessions too) is killed when it ends. DIR receives report.md, report.json, pytest.log,
outcomes.jsonl, junit.xml (absent when cut short) and numbers.jsonl. Exit status: 0 every selected test passed (or
skipped for too few GPUs), 1 a test failed, was cut short or was not reached, 2 refused before testing (a missing
package, no usable CUDA: the reason, in one line, is in the report). tests/test_device_check*.py fake the machine.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # gpu_tests/, also when this file is loaded by path
from process_tree import kill_marked, marked_env, new_mark

REPO = Path(__file__).resolve().parent.parent
PREINSTALLED = ("torch", "transformers", "peft", "accelerate", "safetensors", "pytest")  # the machine's; never carried
CARRIED = ("pydantic", "flyte")  # what `rl` (and the clustered step's entry) imports that the machine lacks
SELECTION = "gpu and not vllm"
NOT_CARRIED = "not run: the wheel cannot be carried (vllm's wheel is over 300 MB; 64 MiB travel with the tree)"
TESTS = ("gpu_tests", "-m", SELECTION)
OUTCOMES_ENV = "RL_GPU_OUTCOMES"  # gpu_tests/outcome_log.py appends each test's progress there
# The whole check's budget, preflight included, so that it ends within 5 minutes of device time: with the machine's
# start (1-2 min) a try costs about 7 of the 15 device minutes, and a rerun fits. docs/gpu.md#the-device-check.
BUDGET_S = 270


@dataclass
class Outcome:
    name: str
    outcome: str  # passed, failed, error, skipped, unfinished, or "not run: ..."
    seconds: float | None = None
    detail: str = ""
    numbers: dict[str, Any] = field(default_factory=dict)


@dataclass
class Report:
    started: str
    python: str = platform.python_version()
    driver: str | None = None
    torch: str | None = None
    cuda: str | None = None
    gpus: list[str] = field(default_factory=list)
    refused: str | None = None
    pytest_exit: int | None = None
    left_behind: int = 0  # processes still running when pytest ended or was cut: all killed
    wall_s: float = 0.0
    tests: list[Outcome] = field(default_factory=list)
    not_run: list[Outcome] = field(default_factory=list)

    def verdict(self) -> tuple[str, int]:
        if self.refused is not None:
            return f"REFUSED: {self.refused}", 2
        bad = [t for t in self.tests if t.outcome in ("failed", "error", "unfinished", "not reached")]
        counts: dict[str, int] = {}
        for t in self.tests:
            counts[t.outcome] = counts.get(t.outcome, 0) + 1
        tally = ", ".join(f"{n} {outcome}" for outcome, n in counts.items())
        if bad or self.pytest_exit not in (0, None) or not self.tests:
            cut = "; cut at the budget" if self.pytest_exit == 124 else f"; pytest exit {self.pytest_exit}"
            return f"FAILED: {len(bad)} of {len(self.tests)} selected tests ({tally or 'none ran'}{cut})", 1
        return f"passed: {sum(t.outcome == 'passed' for t in self.tests)} of {len(self.tests)} selected tests", 0


def _present(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def carry_packages(wheels: Path | None, site: Path) -> str | None:
    """Check the machine's packages and install the carried ones from `wheels` into `site` (offline); the reason
    to refuse, in one line, or None."""
    missing = [name for name in PREINSTALLED if not _present(name)]
    if missing:
        return f"missing package(s) {', '.join(missing)}: the device machine must provide them (they are never carried)"
    needed = [name for name in CARRIED if not _present(name)]
    if not needed:
        return None
    if wheels is None or not wheels.is_dir() or not any(wheels.glob("*.whl")):
        return (
            f"missing package(s) {', '.join(needed)} and no wheels for them in {wheels}: run "
            "scripts/gpu/device_wheels.sh where PyPI is reachable and carry .device-wheels"
        )
    reason = install_wheels(wheels, site)
    if reason is not None:
        return f"installing {', '.join(needed)} from {wheels} failed: {reason}"
    sys.path.insert(0, str(site))
    importlib.invalidate_caches()
    still = [name for name in needed if not _present(name)]
    if still:
        return (
            f"missing package(s) {', '.join(still)}: no wheel for them in {wheels}; run scripts/gpu/device_wheels.sh "
            "where PyPI is reachable and carry .device-wheels"
        )
    return None


def _top_level(archive: Any) -> set[str]:
    """The importable names a wheel installs: its top-level packages and modules."""
    names = set()
    for member in archive.namelist():
        top = member.split("/", 1)[0]
        if top.endswith((".dist-info", ".data")):
            continue
        if "/" in member:
            names.add(top)  # a package
        elif top.endswith((".py", ".so")):
            names.add(top.split(".", 1)[0])  # a module, or an extension module
    return names


def install_wheels(wheels: Path, site: Path) -> str | None:
    """Unpack into `site`, as pip's --target would, every wheel in `wheels` this interpreter can run (by its tags) that
    installs something the machine lacks, with no index and no pip (the machine may have none); why not, or None. The
    machine's own packages win: a wheel whose every module it already has is left out, so what torch, transformers and
    peft import is what the machine came with. A wheel is a zip of its install tree."""
    import zipfile

    from packaging.tags import sys_tags
    from packaging.utils import parse_wheel_filename

    supported = set(sys_tags())
    chosen: dict[str, Path] = {}
    for wheel in sorted(wheels.glob("*.whl")):
        name, _, _, tags = parse_wheel_filename(wheel.name)
        if tags & supported:
            chosen.setdefault(str(name), wheel)
    if not chosen:
        return f"none of its wheels fits this interpreter (Python {platform.python_version()}, {platform.machine()})"
    site.mkdir(parents=True, exist_ok=True)
    for wheel in chosen.values():
        with zipfile.ZipFile(wheel) as archive:
            modules = _top_level(archive)
            if modules and all(_present(m) for m in modules):
                continue
            archive.extractall(site)
    return None


def cuda_preflight(report: Report) -> str | None:
    """Driver, torch, CUDA and GPUs into `report`; why CUDA is unusable (rl.gpu's reason, one line), or None."""
    import torch

    from rl.gpu import cuda_unavailable_reason, nvidia_driver_version

    report.driver, report.torch, report.cuda = nvidia_driver_version(), torch.__version__, torch.version.cuda
    reason = cuda_unavailable_reason(1)
    if reason is None:
        report.gpus = [
            f"{torch.cuda.get_device_name(i)} ({torch.cuda.get_device_properties(i).total_memory / 2**30:.0f} GiB)"
            for i in range(torch.cuda.device_count())
        ]
    return reason


def vllm_tests(env: dict[str, str]) -> list[Outcome]:
    """Every vLLM test of the tier, as not run (collected, never executed)."""
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "gpu_tests", "-m", "gpu and vllm", "--collect-only", "-q", "-p",
         "no:cacheprovider"],
        cwd=REPO, env=env, capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    names = [line.split("::", 1)[1] for line in proc.stdout.splitlines() if "::" in line]
    reason = NOT_CARRIED if not _present("vllm") else "not run: outside this check (nox -s gpu runs them)"
    return [Outcome(name, reason) for name in names]


def wait_budget(proc: subprocess.Popen[bytes], budget_s: float) -> int | None:
    """pytest's exit status, or None when the budget ran out first."""
    try:
        return proc.wait(timeout=max(budget_s, 0.0))
    except subprocess.TimeoutExpired:
        return None


def run_selection(
    env: dict[str, str],
    work: Path,
    budget_s: float,
    tests: Sequence[str] | None = None,
    wait: Callable[[subprocess.Popen[bytes], float], int | None] = wait_budget,
) -> tuple[int, int]:
    """pytest over `tests` (default `TESTS`), each test's progress logged as it happens (`outcome_log`); when `wait`
    says the budget ran out, pytest and every process it started, torchrun's setsid workers too, are killed
    (`process_tree`). Returns (exit status, 124 on the budget; how many processes were killed). Whatever pytest leaves
    running after it exits is killed as well."""
    mark = new_mark()
    env = marked_env({**env, OUTCOMES_ENV: str(work / "outcomes.jsonl")}, mark)
    cmd = [sys.executable, "-m", "pytest", *(TESTS if tests is None else tests), "-p", "gpu_tests.outcome_log",
           "-p", "no:cacheprovider", "-q", "-rA", f"--junitxml={work / 'junit.xml'}"]  # fmt: skip
    with (work / "pytest.log").open("w") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        finished = wait(proc, budget_s)
        status = 124 if finished is None else finished
        try:
            killed = len(kill_marked(mark))
        except RuntimeError as exc:  # a process stuck in the driver: the report says so instead of being lost
            log.write(f"\n[device_check] {exc}\n")
            killed = -1
        if proc.poll() is None:  # no /proc (not Linux): its process group is all that can be reached
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    return status, killed


def _fold(name: str, phases: dict[str, dict[str, Any]], started: bool, cut: str) -> Outcome:
    """One test's outcome from its phase reports (pytest's own rules: a failed setup or teardown is an error)."""
    seconds = round(sum(float(p.get("seconds") or 0) for p in phases.values()), 3) if phases else None
    for when, failed_as in (("setup", "error"), ("call", "failed"), ("teardown", "error")):
        phase = phases.get(when)
        if phase is not None and phase["outcome"] == "failed":
            return Outcome(name, failed_as, seconds, phase.get("detail", ""))
        if phase is not None and phase["outcome"] == "skipped":
            return Outcome(name, "skipped", seconds, phase.get("detail", ""))
    if "teardown" in phases:
        return Outcome(name, "passed", seconds)
    if not started:
        return Outcome(name, "not reached", None, cut)
    where = "in its teardown (its call passed)" if "call" in phases else "while it ran"
    return Outcome(name, "unfinished", seconds, f"{cut} {where}")


def read_outcomes(outcomes: Path, numbers: Path, pytest_exit: int | None) -> list[Outcome]:
    """Each selected test's outcome from the progress log `outcome_log` wrote as the run went (so a run cut short still
    shows what finished), with its recorded numbers (`gpu_report`): passed, failed, error or skipped when it finished;
    unfinished when it was running at the end; not reached when the run ended before it started."""
    found: dict[str, dict[str, Any]] = {}
    if numbers.is_file():
        for line in numbers.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                found.setdefault(str(row.pop("test")), {}).update(row)
    names: list[str] = []
    started: set[str] = set()
    phases: dict[str, dict[str, dict[str, Any]]] = {}
    lines = outcomes.read_text().splitlines() if outcomes.is_file() else []
    for line in lines:
        try:
            event = json.loads(line)
        except json.JSONDecodeError:  # a line cut by the kill
            continue
        if event["event"] == "collected":
            names += [n for n in event["names"] if n not in names]
        elif event["event"] == "start":
            started.add(event["name"])
        elif event["event"] == "report":
            phases.setdefault(event["name"], {})[event["when"]] = event
        if event.get("name") and event["name"] not in names:
            names.append(event["name"])
    cut = "killed at the budget" if pytest_exit == 124 else f"pytest ended (exit {pytest_exit})"
    outcomes_ = [_fold(n, phases.get(n, {}), n in started, cut) for n in names]
    for outcome in outcomes_:
        outcome.numbers = found.pop(outcome.name, {})
    return outcomes_ + [Outcome(n, "unfinished", None, cut, extra) for n, extra in found.items()]


def _numbers(report: Report, prefix: str) -> dict[str, Any]:
    return next((t.numbers for t in report.tests if t.name.startswith(prefix) and t.numbers), {})


def render(report: Report) -> str:
    verdict, _ = report.verdict()
    lines = [
        f"# Device check, {report.started}",
        "",
        f"- verdict: {verdict}",
        f"- driver {report.driver or 'none found'}; torch {report.torch} (CUDA {report.cuda}); Python {report.python}",
        f"- GPUs: {'; '.join(report.gpus) or 'none usable'}; wall {report.wall_s:.0f} s",
        f"- processes left running at the end, killed: {report.left_behind}"
        + (" (some survived SIGKILL: see pytest.log)" if report.left_behind < 0 else ""),
    ]
    ratio = _numbers(report, "test_bf16_first_step_ratios")
    lines.append(
        "- bf16 first-step ratio spread: "
        + (", ".join(f"{k} {ratio[k]}" for k in ("min", "p01", "p99", "max", "clipped_fraction") if k in ratio)
           or "not measured")
    )  # fmt: skip
    memory = _numbers(report, "test_the_real_size_step_on_cuda")
    lines.append(
        f"- peak memory against the plan: max_memory_allocated {memory['peak_gib']} GiB, rl plan {memory['plan_gib']} "
        f"GiB (plan/peak {memory['plan_over_peak']})"
        if {"peak_gib", "plan_gib", "plan_over_peak"} <= memory.keys()
        else "- peak memory against the plan: not measured"
    )
    lines += ["", "| test | outcome | s | numbers / reason |", "| --- | --- | --- | --- |"]
    for t in [*report.tests, *report.not_run]:
        text = ", ".join(f"{k}={v}" for k, v in t.numbers.items())
        text = "; ".join(x for x in (t.detail, text) if x).replace("|", "/")
        seconds = "-" if t.seconds is None else f"{t.seconds:.1f}"
        lines.append(f"| {t.name} | {t.outcome} | {seconds} | {text} |")
    return "\n".join(lines) + "\n"


def write(report: Report, out: Path) -> int:
    verdict, status = report.verdict()
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps({**asdict(report), "verdict": verdict}, indent=2) + "\n")
    text = render(report)
    (out / "report.md").write_text(text)
    print(text)
    return status


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="device_check.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="the folder that receives the report")
    parser.add_argument("--wheels", type=Path, default=None, help="carried wheels (scripts/gpu/device_wheels.sh)")
    parser.add_argument(
        "--budget-s", type=float, default=BUDGET_S, help=f"the whole check's budget (default {BUDGET_S} s)"
    )
    args = parser.parse_args(argv)
    start = time.monotonic()
    report = Report(started=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
    work = Path(tempfile.mkdtemp(prefix="rl-device-check-"))
    try:
        report.refused = carry_packages(args.wheels, work / "site")
        if report.refused is None:
            sys.path.insert(0, str(REPO))
            report.refused = cuda_preflight(report)
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(REPO), str(work / "site"), os.environ.get("PYTHONPATH", "")]),
            "RL_GPU_STRICT": "1", "RL_GPU_REPORT": str(work / "numbers.jsonl"), "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1", "PIP_NO_INDEX": "1", "TOKENIZERS_PARALLELISM": "false",
        }  # fmt: skip
        if report.refused is None:
            report.not_run = vllm_tests(env)
            budget = args.budget_s - (time.monotonic() - start)
            report.pytest_exit, report.left_behind = run_selection(env, work, budget)
            report.tests = read_outcomes(work / "outcomes.jsonl", work / "numbers.jsonl", report.pytest_exit)
            args.out.mkdir(parents=True, exist_ok=True)
            for name in ("pytest.log", "outcomes.jsonl", "junit.xml", "numbers.jsonl"):
                if (work / name).is_file():
                    shutil.copy(work / name, args.out / name)
        report.wall_s = time.monotonic() - start
        return write(report, args.out)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
