"""The GPU preflight of `rl.gpu` with faked readings: a CUDA 13 torch on a driver older than R580 is refused with the
driver's version and the R580 requirement (not "no NVIDIA driver"), the driver version is read from
/proc/driver/nvidia/version or nvidia-smi, and strict mode's NCCL rule: a run where no NCCL test fits the GPUs fails."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from rl import gpu

# As the open and the proprietary kernel modules print it.
PROC_OPEN = (
    "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.86.15  Release Build  (dvs-builder@U16)  Thu Jan\n"
)
PROC_PROPRIETARY = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.65.06  Sun Jul 27 07:09:23 UTC 2025\n"


def test_the_driver_version_is_read_from_proc(tmp_path: Path) -> None:
    for text, version in ((PROC_OPEN, "570.86.15"), (PROC_PROPRIETARY, "580.65.06")):
        proc = tmp_path / "version"
        proc.write_text(text + "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n")
        assert gpu.nvidia_driver_version(proc, smi=str(tmp_path / "absent")) == version


def test_without_proc_the_driver_version_comes_from_nvidia_smi(tmp_path: Path) -> None:
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 575.51.03\n")
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    assert gpu.nvidia_driver_version(tmp_path / "no-proc", smi=str(smi)) == "575.51.03"
    assert gpu.nvidia_driver_version(tmp_path / "no-proc", smi=str(tmp_path / "absent")) is None


@pytest.mark.parametrize(
    ("cuda", "driver", "refused"),
    [("13.0", "570.86.15", True), ("13.0", "580.65.06", False), ("13.0", "590.1", False), ("12.8", "570.86.15", False),
     ("12.4", "520.61.05", True), ("13.0", None, False), (None, "570.86.15", False)],
)  # fmt: skip
def test_a_driver_older_than_the_cuda_build_needs_is_named(cuda: str | None, driver: str | None, refused: bool) -> None:
    reason = gpu.driver_too_old_reason(cuda, driver, "2.14.0")
    assert (reason is not None) == refused
    if reason is not None:
        assert driver is not None and driver in reason and f"CUDA {cuda}" in reason
        assert ("R580" if cuda == "13.0" else "R525") in reason


def test_cuda_13_torch_on_an_r570_driver_says_so_instead_of_no_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(gpu, "nvidia_driver_version", lambda: "570.86.15")
    reason = gpu.cuda_unavailable_reason()
    assert reason is not None and "R580" in reason and "570.86.15" in reason and "no NVIDIA driver" not in reason
    monkeypatch.setattr(gpu, "nvidia_driver_version", lambda: "580.65.06")
    reason = gpu.cuda_unavailable_reason()
    assert reason is not None and "driver 580.65.06 is loaded" in reason and "R580" not in reason
    monkeypatch.setattr(gpu, "nvidia_driver_version", lambda: None)
    reason = gpu.cuda_unavailable_reason()
    assert reason is not None and "no NVIDIA driver" in reason


def test_strict_mode_requires_an_nccl_test_that_fits_the_gpus() -> None:
    """The rule: on a one-GPU runner the one-rank NCCL test runs; were it gone, the 2-GPU test's skip is a failure."""
    assert gpu.nccl_uncovered_reason([2, 1], gpus=1) is None
    assert gpu.nccl_uncovered_reason([2], gpus=2) is None
    reason = gpu.nccl_uncovered_reason([2], gpus=1)
    assert reason is not None and "no NCCL test runs on 1 GPU" in reason
    assert gpu.nccl_uncovered_reason([], gpus=1) is not None
    assert gpu.nccl_uncovered_reason([2], gpus=0) is None  # no CUDA is a failure of its own


def test_the_gpu_tier_has_a_one_gpu_nccl_test() -> None:
    """The rule's other half, read from the source: test_ddp_nccl.py's one-rank test carries `gpus(1)` and the module's
    `nccl` marker, so a one-GPU runner satisfies `nccl_uncovered_reason`."""
    import ast

    source = (Path(__file__).resolve().parents[1] / "gpu_tests" / "test_ddp_nccl.py").read_text()
    tree = ast.parse(source)
    module_marks = next(
        ast.unparse(node.value)
        for node in tree.body
        if isinstance(node, ast.Assign) and "pytestmark" in ast.unparse(node)
    )
    assert "pytest.mark.nccl" in module_marks
    one_gpu = [
        node.name
        for node in tree.body
        if isinstance(node, ast.FunctionDef) and "pytest.mark.gpus(1)" in map(ast.unparse, node.decorator_list)
    ]
    assert one_gpu == ["test_a_one_rank_nccl_step_equals_the_single_gpu_step"]


# ---------------------------------------------------------------------------------------------------------------------
# gpu_tests/first_gpu_run.sh refuses before installing anything

FIRST_RUN = Path(__file__).resolve().parents[1] / "gpu_tests" / "first_gpu_run.sh"


def _first_run(tmp_path: Path, smi_prints: str | None) -> subprocess.CompletedProcess[str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if smi_prints is not None:
        smi = bin_dir / "nvidia-smi"
        smi.write_text(f"#!/bin/sh\necho {smi_prints}\n")
        smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "HOME": str(tmp_path / "home"),
        "RL_PROC_DRIVER_VERSION": str(tmp_path / "no-proc-version"),
        "RL_FIRST_RUN_OUT": str(tmp_path / "out"),
    }
    return subprocess.run(["bash", str(FIRST_RUN)], env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.slow
def test_first_gpu_run_is_valid_executable_bash() -> None:
    assert os.access(FIRST_RUN, os.X_OK), "first_gpu_run.sh must be executable"
    subprocess.run(["bash", "-n", str(FIRST_RUN)], check=True, timeout=30)
    text = FIRST_RUN.read_text()
    for needle in ("set -euo pipefail", "uv sync --locked", "RL_GPU_STRICT=1", "bench --gpu", "timeout"):
        assert needle in text, needle


@pytest.mark.slow
def test_first_gpu_run_refuses_a_machine_without_a_driver_before_installing(tmp_path: Path) -> None:
    proc = _first_run(tmp_path, smi_prints=None)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.startswith("first_gpu_run: no NVIDIA driver"), proc.stderr
    assert "install" not in proc.stdout and not (tmp_path / "out").exists()


@pytest.mark.slow
def test_first_gpu_run_refuses_a_driver_older_than_r580_naming_it(tmp_path: Path) -> None:
    proc = _first_run(tmp_path, smi_prints="570.86.15")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "570.86.15" in proc.stderr and "R580" in proc.stderr, proc.stderr
    assert not (tmp_path / "out").exists()
