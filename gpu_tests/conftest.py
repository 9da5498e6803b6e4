"""GPU tests: every test here carries the `gpu` marker and skips with a precise reason when its hardware is missing.

Requirements are declared with markers and enforced here, before any fixture runs, so a machine without a GPU never
builds a model or starts vLLM just to skip:

    @pytest.mark.gpu          needs CUDA (every test in this folder; a test without it is a collection error)
    @pytest.mark.gpus(2)      needs at least 2 CUDA GPUs
    @pytest.mark.vllm         needs vllm installed (`pip install -e '.[gpu]'`)

The reasons come from `rl.gpu` ("needs CUDA: torch 2.x+cpu is a CPU-only build ...", "needs 2 CUDA GPUs, found 1
(NVIDIA L4)", "needs vllm: it is not installed ..."). With `RL_GPU_STRICT=1` (set by `nox -s gpu` and
`gpu_tests/device_check.py`, which run on machines that must have a GPU) a missing CUDA or vllm is a failure, not a
skip; too few GPUs still skips, since single-GPU runners are the common case. The same checks are available inside a
test or fixture as `gpu_helpers.requires_cuda()`, `requires_gpus(n)` and `requires_vllm()`.

Fixtures shared by the modules: the vLLM-servable tiny model (`gpu_model_dir`, built offline from `rl.gpu.VLLM_MODEL`),
one artifact store (`gpu_store`), one `VLLMEngine` for the session (`vllm_engine`: one vLLM start-up, about 20-60 s,
for every vLLM test), and `gpu_report`, which records a test's key numbers for `device_check.py`'s report.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# cuBLAS picks reduction strategies by workspace; a fixed workspace makes a replayed CUDA train step bitwise identical.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from gpu_helpers import missing_requirement, requires_cuda, requires_vllm

from rl.gpu import cuda_unavailable_reason, nccl_uncovered_reason, strict, vllm_llm_kwargs
from rl.models.opened_model import open_model

REPORT_ENV = "RL_GPU_REPORT"
_HERE = Path(__file__).resolve().parent


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpus(n): needs at least n CUDA GPUs (skips with the count found otherwise)")
    config.addinivalue_line("markers", "vllm: needs vllm installed (the GPU extra); deselect with -m 'not vllm'")
    config.addinivalue_line("markers", "nccl: runs an NCCL process group (strict mode requires one to fit the GPUs)")


_NCCL_GAP: list[str] = []  # set at collection: why this run would test no NCCL path (strict mode fails on it)


def _gpus(item: pytest.Item) -> int:
    gpus = item.get_closest_marker("gpus")
    return int(gpus.args[0]) if gpus is not None else 1


def _requirement(item: pytest.Item) -> tuple[str, bool] | None:
    missing = missing_requirement(_gpus(item), needs_vllm=item.get_closest_marker("vllm") is not None)
    if missing is not None and not missing[1] and _NCCL_GAP and item.get_closest_marker("nccl") is not None:
        # Too few GPUs only skips, except that strict mode will not let every NCCL test skip.
        return f"{missing[0]}; {_NCCL_GAP[0]}", True
    return missing


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test here must be marked `gpu`; one whose hardware is missing gets a skip marker with the reason (shown
    at the test's own line by `-rs`), unless RL_GPU_STRICT=1 makes the lack a failure (then setup fails it)."""
    _NCCL_GAP.clear()
    if cuda_unavailable_reason(1) is None:
        import torch

        nccl = [_gpus(i) for i in items if i.get_closest_marker("nccl") is not None]
        gap = nccl_uncovered_reason(nccl, torch.cuda.device_count())
        _NCCL_GAP.extend([gap] if gap else [])
    for item in items:
        if Path(item.path).resolve().parent != _HERE:
            continue
        if item.get_closest_marker("gpu") is None:
            raise pytest.UsageError(
                f"{item.nodeid} lacks @pytest.mark.gpu: every test in gpu_tests/ must carry it, so that "
                "`-m 'not gpu'` never runs one on a CPU machine"
            )
        missing = _requirement(item)
        if missing is not None and not (missing[1] and strict()):
            item.add_marker(pytest.mark.skip(reason=missing[0]))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Under RL_GPU_STRICT=1, fail a test whose CUDA or vllm is missing, before any fixture runs."""
    missing = _requirement(item) if item.get_closest_marker("gpu") is not None and strict() else None
    if missing is not None and missing[1]:
        pytest.fail(f"{missing[0]} [RL_GPU_STRICT=1: this machine must provide it]", pytrace=False)


# ---------------------------------------------------------------------------------------------------------------------
# Fixtures


@pytest.fixture
def cuda_device() -> Any:
    """`torch.device("cuda", 0)`, after checking CUDA is usable."""
    requires_cuda()
    import torch

    return torch.device("cuda", 0)


@pytest.fixture(scope="session")
def gpu_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The vLLM-servable tiny model (`rl.gpu.VLLM_MODEL`), built offline on the CPU; read-only by convention."""
    from rl.gpu import VLLM_MODEL
    from rl.models import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("vllm-tiny-model"), VLLM_MODEL)


@pytest.fixture(scope="session")
def gpu_store(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """One `LocalArtifacts` store for the session: the vLLM engine reads every adapter it serves from it."""
    from rl.storage.artifacts import LocalArtifacts

    return LocalArtifacts(tmp_path_factory.mktemp("gpu-artifacts"))


@pytest.fixture(scope="session")
def vllm_engine(gpu_model_dir: Path, gpu_store: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One `VLLMEngine` (real vLLM, bf16, LoRA enabled) over `gpu_model_dir` and `gpu_store`, started once.

    It is shared, like a long-lived rollout server: each distinct adapter gets its own vLLM LoRA id, whatever policy
    version it is requested under (the sampler tests use versions 100 and up, the driver 0, 1, 2).
    """
    requires_cuda()
    requires_vllm()
    from rl.models import load_tokenizer
    from rl.samplers.vllm import VLLMEngine

    engine = VLLMEngine(
        open_model(gpu_model_dir),
        gpu_store,
        adapter_root=tmp_path_factory.mktemp("vllm-adapters"),
        llm_kwargs=vllm_llm_kwargs(),
        tokenizer=load_tokenizer(open_model(gpu_model_dir)),
    )
    _ = engine.llm  # start vLLM now, so its start-up is not charged to the first test
    yield engine
    engine.close()  # vLLM 0.33's LLMEngine has no shutdown(); the engine stops its engine core


@pytest.fixture
def gpu_report(request: pytest.FixtureRequest, record_property: Callable[[str, object], None]) -> Callable[..., None]:
    """`gpu_report(key=value, ...)`: a test's key numbers, kept as junit properties and, when `RL_GPU_REPORT` names a
    file, appended to it as one JSON line (`device_check.py` puts them in its report)."""

    def report(**numbers: object) -> None:
        for key, value in numbers.items():
            record_property(key, value)
        print(f"{request.node.name}: " + ", ".join(f"{k}={v}" for k, v in numbers.items()))
        path = os.environ.get(REPORT_ENV)
        if path:
            with open(path, "a", encoding="utf-8") as f:
                f.write(json.dumps({"test": request.node.name, **numbers}, default=str) + "\n")

    return report
