"""The device check: the torch-only GPU tests on the machine this project may be lent (one H200, no network at all,
Python 3.12 with torch, transformers, peft, accelerate, safetensors, pytest, hypothesis and pytest-xdist
preinstalled; no pydantic, vLLM or Flyte), in at most 8 minutes, with a short report in a folder the caller names.

    scripts/gpu/device_wheels.sh                 # here, once: pydantic's wheels (2.8 MB) into .device-wheels/
    python3 gpu_tests/device_check.py --wheels .device-wheels --out DIR      # there, with .device-wheels carried

It installs nothing from the network: the carried wheels are unpacked into a temporary folder (no index, no pip), the
machine's own torch is the one tested, and the package runs from this checkout. It runs `gpu_tests -m "gpu and not
vllm"` under RL_GPU_STRICT=1 (the CUDA trainer tests, the bf16 ratios, the one-GPU NCCL step, the real-size
configuration) and lists every vLLM test as not run (vLLM's wheel is over 300 MB; 64 MiB travel). DIR receives
report.md, report.json, pytest.log, junit.xml and numbers.jsonl. Exit status: 0 every selected test passed (or
skipped for too few GPUs), 1 a test failed or the budget ran out, 2 refused before testing (a missing package, no
usable CUDA: the reason, in one line, is in the report). `tests/test_device_check.py` fakes the machine.
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
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
PREINSTALLED = ("torch", "transformers", "peft", "accelerate", "safetensors", "pytest")  # the machine's; never carried
CARRIED = ("pydantic",)  # what `rl` imports that the machine lacks, installed from --wheels
SELECTION = "gpu and not vllm"
NOT_CARRIED = "not run: the wheel cannot be carried (vllm's wheel is over 300 MB; 64 MiB travel with the tree)"
BUDGET_S = 420  # pytest's share of the 8 minutes; the preflight and the report take seconds


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
    wall_s: float = 0.0
    tests: list[Outcome] = field(default_factory=list)
    not_run: list[Outcome] = field(default_factory=list)

    def verdict(self) -> tuple[str, int]:
        if self.refused is not None:
            return f"REFUSED: {self.refused}", 2
        bad = [t for t in self.tests if t.outcome in ("failed", "error", "unfinished")]
        if bad or self.pytest_exit not in (0, None) or not self.tests:
            return f"FAILED: {len(bad)} of {len(self.tests)} selected tests (pytest exit {self.pytest_exit})", 1
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
    return None


def install_wheels(wheels: Path, site: Path) -> str | None:
    """Unpack every wheel in `wheels` this interpreter can run (by its tags) into `site`, as pip's --target would,
    with no index and no pip (the machine may have none); why not, or None. A wheel is a zip of its install tree."""
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


def run_selection(env: dict[str, str], work: Path, budget_s: float) -> int:
    """pytest over the selection, killed (with its torchrun children) when the budget runs out: exit 124 then."""
    log = (work / "pytest.log").open("w")
    cmd = [sys.executable, "-m", "pytest", "gpu_tests", "-m", SELECTION, "-p", "no:cacheprovider", "-q", "-rA",
           f"--junitxml={work / 'junit.xml'}"]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        return proc.wait(timeout=budget_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return 124
    finally:
        log.close()


def read_outcomes(junit: Path, numbers: Path) -> list[Outcome]:
    """Each test's outcome from junit.xml and its recorded numbers (`gpu_report`); a test that recorded numbers but
    has no result was killed: unfinished."""
    found: dict[str, dict[str, Any]] = {}
    if numbers.is_file():
        for line in numbers.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                found.setdefault(str(row.pop("test")), {}).update(row)
    outcomes = []
    if junit.is_file():
        for case in ET.parse(junit).getroot().iter("testcase"):
            name, result, detail = case.get("name", "?"), "passed", ""
            for tag in ("failure", "error", "skipped"):
                child = case.find(tag)
                if child is not None:
                    result = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
                    detail = (child.get("message") or "").strip().splitlines()[0] if child.get("message") else ""
                    break
            outcomes.append(Outcome(name, result, float(case.get("time", 0)), detail, found.pop(name, {})))
    outcomes += [Outcome(name, "unfinished", None, "killed at the budget", extra) for name, extra in found.items()]
    return outcomes


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
    parser.add_argument("--budget-s", type=float, default=BUDGET_S, help=f"pytest's budget (default {BUDGET_S} s)")
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
            report.pytest_exit = run_selection(env, work, args.budget_s - (time.monotonic() - start))
            report.tests = read_outcomes(work / "junit.xml", work / "numbers.jsonl")
            args.out.mkdir(parents=True, exist_ok=True)
            for name in ("pytest.log", "junit.xml", "numbers.jsonl"):
                if (work / name).is_file():
                    shutil.copy(work / name, args.out / name)
        report.wall_s = time.monotonic() - start
        return write(report, args.out)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
