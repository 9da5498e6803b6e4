"""`gpu_tests/device_check.py` on a faked device machine: no network (every index and proxy points at a closed port),
packages it lacks hidden from this environment, and this environment's CPU-only torch standing in for a torch without
usable CUDA. The check must refuse in one line, before testing, with the reason in its report; carry pydantic from
wheels offline; select the real-size test; and list the vLLM tests as not run, never as passed.

The hidden packages: a `sitecustomize` on PYTHONPATH makes `import X` fail for each name in RL_FAKE_HIDDEN unless X
is found outside this environment's site-packages (in the folder the check installs the carried wheels into). The
carried wheels are this environment's own pydantic and its dependencies, repacked as wheels (with their RECORD), so
what the check installs is real pydantic, as on the machine.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "gpu_tests" / "device_check.py"
NOT_ON_THE_MACHINE = ("flyte", "vllm", "ray")
PYDANTIC = ("pydantic", "pydantic_core", "annotated_types", "typing_inspection")
DEAD = "http://127.0.0.1:9"

SITECUSTOMIZE = """
import importlib.machinery, os, sys
_HIDDEN = set(filter(None, os.environ.get("RL_FAKE_HIDDEN", "").split(",")))
_SITE = os.path.realpath(os.environ["RL_FAKE_SITE"])

class _Hide:
    def find_spec(self, name, path=None, target=None):
        if path is not None or name not in _HIDDEN:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        origin = os.path.realpath((spec.origin or list(spec.submodule_search_locations or [""])[0]) if spec else "")
        if spec is None or origin.startswith(_SITE):
            raise ModuleNotFoundError(f"No module named {name!r} (hidden: not on the device machine)", name=name)
        return spec

sys.meta_path.insert(0, _Hide())
"""


def device_check() -> ModuleType:
    spec = importlib.util.spec_from_file_location("device_check", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["device_check"] = module  # its dataclasses resolve their annotations through sys.modules
    spec.loader.exec_module(module)
    return module


def _machine_env(tmp_path: Path, hidden: tuple[str, ...]) -> dict[str, str]:
    shim = tmp_path / "shim"
    shim.mkdir(exist_ok=True)
    (shim / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = {k: v for k, v in os.environ.items() if k not in ("RL_GPU_REPORT", "NVIDIA_VISIBLE_DEVICES")}
    env.update(
        PYTHONPATH=str(shim),
        RL_FAKE_HIDDEN=",".join(hidden),
        RL_FAKE_SITE=sysconfig.get_paths()["purelib"],
        PIP_INDEX_URL=f"{DEAD}/simple",
        PIP_FIND_LINKS="",
        PIP_CONFIG_FILE=os.devnull,
        HTTP_PROXY=DEAD, HTTPS_PROXY=DEAD, http_proxy=DEAD, https_proxy=DEAD,
    )  # fmt: skip
    return env


def _run(tmp_path: Path, hidden: tuple[str, ...], *args: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    out = tmp_path / "report"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(out), *args],
        env=_machine_env(tmp_path, hidden),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    return proc, out


def _closure(*roots: str) -> set[str]:
    """`roots` and every distribution they require here (markers evaluated for this interpreter, no extras)."""
    from importlib.metadata import PackageNotFoundError, distribution

    from packaging.requirements import Requirement

    seen: set[str] = set()
    todo = list(roots)
    while todo:
        name = todo.pop()
        try:
            dist = distribution(name)
        except PackageNotFoundError:
            continue
        key = dist.metadata["Name"].lower().replace("_", "-")
        if key in seen:
            continue
        seen.add(key)
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return seen


def _repacked_wheels(dest: Path) -> Path:
    """This environment's pydantic and Flyte and all they require as wheels: each package's files and its dist-info
    (the check unpacks only those whose modules the machine lacks: here the hidden ones)."""
    from importlib.metadata import distribution

    dest.mkdir()
    for dist_name in sorted(_closure("pydantic", "flyte")):
        dist = distribution(dist_name)
        tag = next(line.split(": ", 1)[1] for line in (dist.read_text("WHEEL") or "").splitlines() if "Tag: " in line)
        name = dist.metadata["Name"].replace("-", "_")
        with zipfile.ZipFile(dest / f"{name}-{dist.version}-{tag}.whl", "w") as whl:
            for file in dist.files or []:
                path = Path(str(file.locate()))
                if path.is_file() and ".." not in file.parts and "__pycache__" not in file.parts:
                    whl.write(path, str(file))
    return dest


def test_a_missing_preinstalled_package_is_refused_in_one_line_before_testing(tmp_path: Path) -> None:
    proc, out = _run(tmp_path, ("peft", *NOT_ON_THE_MACHINE))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["refused"].startswith("missing package(s) peft") and "\n" not in report["refused"]
    assert report["tests"] == [] and "REFUSED: missing package(s) peft" in (out / "report.md").read_text()


def test_pydantic_missing_without_carried_wheels_names_the_script_that_fetches_them(tmp_path: Path) -> None:
    proc, out = _run(tmp_path, (*PYDANTIC, *NOT_ON_THE_MACHINE), "--wheels", str(tmp_path / "none"))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "scripts/gpu/device_wheels.sh" in json.loads((out / "report.json").read_text())["refused"]


@pytest.mark.heavy
def test_carried_wheels_install_offline_and_a_torch_without_cuda_is_refused(tmp_path: Path) -> None:
    """No network, pydantic and Flyte only in the carried wheels, a CPU-only torch: the wheels install with no index,
    `rl` imports, and the check refuses with rl.gpu's reason, naming torch's build; nothing is tested."""
    import torch

    wheels = _repacked_wheels(tmp_path / "wheels")
    proc, out = _run(tmp_path, (*PYDANTIC, *NOT_ON_THE_MACHINE), "--wheels", str(wheels))
    assert "flyte" in NOT_ON_THE_MACHINE
    assert proc.returncode == 2, proc.stdout + proc.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["refused"].startswith("needs CUDA: torch "), report["refused"]
    assert report["torch"] == torch.__version__ and report["cuda"] == torch.version.cuda
    assert report["tests"] == [] and not (out / "junit.xml").exists()


@pytest.mark.heavy
def test_a_cuda_13_torch_on_an_r570_driver_is_refused_naming_both(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    import rl.gpu

    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(rl.gpu, "nvidia_driver_version", lambda *a, **k: "570.86.15")
    assert device_check().main(["--out", str(tmp_path / "out")]) == 2
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert "R580" in report["refused"] and "570.86.15" in report["refused"] and report["driver"] == "570.86.15"


@pytest.mark.heavy
def test_the_selection_on_a_machine_without_flyte_or_vllm_holds_the_real_size_test_and_no_vllm_test(
    tmp_path: Path,
) -> None:
    """What the machine would run, collected with Flyte and vLLM hidden: every module imports without them."""
    check = device_check()
    env = _machine_env(tmp_path, NOT_ON_THE_MACHINE)
    cmd = [sys.executable, "-m", "pytest", "gpu_tests", "-m", check.SELECTION, "--collect-only", "-q", "-p",
           "no:cacheprovider"]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    files = {line.split("::")[0] for line in proc.stdout.splitlines() if "::" in line}
    assert {
        "gpu_tests/test_real_size_trainer.py",
        "gpu_tests/test_cuda_trainer.py",
        "gpu_tests/test_bf16_logprobs.py",
        "gpu_tests/test_ddp_nccl.py",
    } <= files, files
    assert not files & {"gpu_tests/test_vllm_sampler.py", "gpu_tests/test_vllm_pipelined_e2e.py"}, files
    assert "test_the_real_size_one_rank_nccl_step_equals_the_single_gpu_step" in proc.stdout
    vllm = check.vllm_tests(env)
    assert vllm and all(t.outcome == check.NOT_CARRIED for t in vllm)


def test_the_report_gives_each_outcome_the_numbers_and_never_passes_a_vllm_test(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The machine's CUDA and pytest faked (the outcome log and recorded numbers as a run leaves them, one test killed
    at the budget): the report holds each outcome, the ratio spread and peak memory against the plan."""
    check = device_check()

    def fake_preflight(report: object) -> None:
        report.driver, report.torch, report.cuda, report.gpus = "580.95.05", "2.11.0+cu130", "13.0", ["H200 (140 GiB)"]  # type: ignore[attr-defined]

    bf16 = "test_bf16_first_step_ratios"
    real = "test_the_real_size_step_on_cuda_and_its_memory_against_the_plan"
    two = "test_the_two_rank_nccl_step_equals_the_single_gpu_step"
    one = "test_the_real_size_one_rank_nccl_step_equals_the_single_gpu_step"

    def phase(name: str, when: str, outcome: str, seconds: float, detail: str = "") -> dict[str, object]:
        return {"event": "report", "name": name, "when": when, "outcome": outcome, "seconds": seconds, "detail": detail}

    def fake_pytest(env: dict[str, str], work: Path, budget_s: float) -> tuple[int, int]:
        events = [
            {"event": "collected", "names": [bf16, real, two, one]},
            {"event": "start", "name": bf16},
            phase(bf16, "setup", "passed", 0.1), phase(bf16, "call", "passed", 3.0),
            phase(bf16, "teardown", "passed", 0.0),
            {"event": "start", "name": real},
            phase(real, "setup", "passed", 0.2), phase(real, "call", "failed", 40.0, "AssertionError: plan/peak 0.7"),
            phase(real, "teardown", "passed", 0.0),
            {"event": "start", "name": two},
            phase(two, "setup", "skipped", 0.0, "needs 2 CUDA GPUs, found 1 (NVIDIA H200)"),
            phase(two, "teardown", "passed", 0.0),
            {"event": "start", "name": one},
            phase(one, "setup", "passed", 0.1),
        ]  # fmt: skip
        (work / "outcomes.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
        rows = [
            {"test": bf16, "min": 0.89, "p01": 0.91, "p99": 1.11, "max": 1.19},
            {"test": real, "peak_gib": 3.1, "plan_gib": 2.2, "plan_over_peak": 0.71},
            {"test": one, "torchrun_s": 12},
        ]
        (work / "numbers.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        return 124, 2

    monkeypatch.setattr(check, "cuda_preflight", lambda report: fake_preflight(report))
    monkeypatch.setattr(check, "run_selection", fake_pytest)
    monkeypatch.setattr(check, "vllm_tests", lambda env: [check.Outcome("test_vllm_logprobs", check.NOT_CARRIED)])
    out = tmp_path / "out"
    assert check.main(["--out", str(out)]) == 1
    report = json.loads((out / "report.json").read_text())
    outcomes = {t["name"]: t["outcome"] for t in report["tests"] + report["not_run"]}
    assert outcomes == {
        "test_bf16_first_step_ratios": "passed",
        "test_the_real_size_step_on_cuda_and_its_memory_against_the_plan": "failed",
        "test_the_two_rank_nccl_step_equals_the_single_gpu_step": "skipped",
        "test_the_real_size_one_rank_nccl_step_equals_the_single_gpu_step": "unfinished",
        "test_vllm_logprobs": check.NOT_CARRIED,
    }
    text = (out / "report.md").read_text()
    assert "FAILED: 2 of 4" in text and "driver 580.95.05; torch 2.11.0+cu130 (CUDA 13.0)" in text
    assert "ratio spread: min 0.89, p01 0.91, p99 1.11, max 1.19" in text
    assert "max_memory_allocated 3.1 GiB, rl plan 2.2 GiB (plan/peak 0.71)" in text
    assert "| test_vllm_logprobs | not run: the wheel cannot be carried" in text
    assert "cut at the budget" in text and "killed: 2" in text
    assert (out / "outcomes.jsonl").is_file() and (out / "numbers.jsonl").is_file()
