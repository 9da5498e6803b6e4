"""The GPU tier as seen from a CPU machine: gpu_tests/ collects, every test there is marked `gpu` and skips with the
precise reason (or fails under RL_GPU_STRICT=1), `rl bench --gpu` exits non-zero with the reason, and the reasons
and vLLM settings in `rl.gpu` are what they claim (gpu_tests/device_check.py: tests/test_device_check.py)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from rl import gpu
from rl.cli import main
from rl.models.opened_model import open_model

REPO = Path(__file__).resolve().parent.parent
GPU_TESTS = REPO / "gpu_tests"
CUDA_REASON = gpu.cuda_unavailable_reason(1)
needs_no_cuda = pytest.mark.skipif(CUDA_REASON is None, reason="CUDA is available here: the GPU tests would run")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in (gpu.STRICT_ENV, "RL_GPU_REPORT")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env["HF_HUB_OFFLINE"] = "1"
    return {**env, **extra}


# One interpreter runs the folder twice, plain and with RL_GPU_STRICT=1, so torch and peft are imported once.
_TWO_RUNS = """
import os, sys
import pytest
folder, out = sys.argv[1], sys.argv[2]
codes = []
for name, strict in (("plain", "0"), ("strict", "1")):
    os.environ["RL_GPU_STRICT"] = strict
    codes.append(pytest.main([folder, "-p", "no:cacheprovider", "-q", "-rs", f"--junitxml={out}/{name}.xml"]))
    print(f"=== {name} exit {int(codes[-1])}", flush=True)
"""


@dataclass(frozen=True)
class GpuTestsRun:
    output: str
    exit_codes: dict[str, int]
    cases: dict[str, list[ET.Element]]


@pytest.fixture(scope="module")
def gpu_tests_run(tmp_path_factory: pytest.TempPathFactory) -> GpuTestsRun:
    out = tmp_path_factory.mktemp("gpu-tests-run")
    proc = subprocess.run(
        [sys.executable, "-c", _TWO_RUNS, str(GPU_TESTS), str(out)],
        cwd=REPO,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    codes = {m.group(1): int(m.group(2)) for m in re.finditer(r"=== (\w+) exit (\d+)", proc.stdout)}
    cases = {
        name: list(ET.parse(out / f"{name}.xml").getroot().iter("testcase")) if (out / f"{name}.xml").is_file() else []
        for name in ("plain", "strict")
    }
    return GpuTestsRun(proc.stdout + proc.stderr, codes, cases)


@pytest.mark.slow  # a subprocess that imports torch and collects gpu_tests/: seconds, so not in unit
@needs_no_cuda
def test_every_gpu_test_collects_is_marked_gpu_and_skips_with_the_precise_reason(gpu_tests_run: GpuTestsRun) -> None:
    """All of gpu_tests/ (no -m filter) collects; conftest refuses any test without the gpu marker, so a clean run
    means every one carries it; each is skipped, before any fixture, with rl.gpu's reason for this machine."""
    assert gpu_tests_run.exit_codes.get("plain") == 0, gpu_tests_run.output[-6000:]
    cases = gpu_tests_run.cases["plain"]
    assert len(cases) >= 8, gpu_tests_run.output[-6000:]
    for case in cases:
        skipped = case.find("skipped")
        assert skipped is not None, f"{case.get('name')} was not skipped on a machine without CUDA"
        assert skipped.get("message") == CUDA_REASON, (case.get("name"), skipped.get("message"))


@pytest.mark.slow  # a subprocess that imports torch and collects gpu_tests/: seconds, so not in unit
@needs_no_cuda
def test_strict_mode_turns_a_missing_gpu_into_failures(gpu_tests_run: GpuTestsRun) -> None:
    """RL_GPU_STRICT=1 (nox -s gpu, device_check.py): no CUDA fails every test with the reason instead of skipping."""
    assert gpu_tests_run.exit_codes.get("strict") == 1, gpu_tests_run.output[-6000:]
    cases = gpu_tests_run.cases["strict"]
    assert len(cases) == len(gpu_tests_run.cases["plain"])
    for case in cases:
        error = case.find("error")
        assert error is not None and f"{CUDA_REASON} [RL_GPU_STRICT=1" in (error.get("message") or ""), case.get("name")


@needs_no_cuda
def test_rl_bench_gpu_exits_nonzero_with_the_reason_not_a_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--gpu"]) == 2
    err = capsys.readouterr().err
    assert f"rl bench --gpu: {CUDA_REASON}" in err and "Traceback" not in err


# ---------------------------------------------------------------------------------------------------------------------
# rl.gpu


def test_cuda_reasons_name_what_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setattr(torch.version, "cuda", None)
    assert gpu.cuda_unavailable_reason() == (
        f"needs CUDA: torch {torch.__version__} is a CPU-only build (torch.version.cuda is None)"
    )
    monkeypatch.setattr(torch.version, "cuda", "12.4")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(gpu, "nvidia_driver_version", lambda: None)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    reason = gpu.cuda_unavailable_reason()
    assert reason is not None and "built for CUDA 12.4 but torch.cuda.is_available() is False" in reason
    assert "CUDA_VISIBLE_DEVICES=)" in reason
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i: "NVIDIA L4")
    assert gpu.cuda_unavailable_reason(1) is None
    assert gpu.cuda_unavailable_reason(2) == "needs 2 CUDA GPUs, found 1 (NVIDIA L4)"


def test_vllm_reason_names_the_extra_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    reason = gpu.vllm_unavailable_reason()
    assert reason is not None and reason.startswith("needs vllm: it is not installed") and ".[gpu]" in reason
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object())
    assert gpu.vllm_unavailable_reason() is None


def test_strict_reads_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(gpu.STRICT_ENV, raising=False)
    assert not gpu.strict()
    monkeypatch.setenv(gpu.STRICT_ENV, "1")
    assert gpu.strict()


def test_the_vllm_model_fits_vllm_attention_and_lora_constraints() -> None:
    """head_dim 64 (FlashInfer's 64/128/256, FlashAttention's multiples of 8), GQA, widths multiples of 64, and a
    vocabulary far below LoRA's upper bound."""
    from rl.models.tiny import build_tokenizer

    m = gpu.VLLM_MODEL
    head_dim = m.hidden_size // m.heads
    assert head_dim in (64, 128, 256)
    assert m.heads % m.kv_heads == 0 and m.kv_heads < m.heads
    assert all(w % 64 == 0 for w in (m.hidden_size, m.intermediate, m.kv_heads * head_dim))
    assert len(build_tokenizer()) <= 258048
    kwargs = gpu.vllm_llm_kwargs()
    assert kwargs["max_model_len"] == m.max_position and kwargs["dtype"] == "bfloat16"
    assert kwargs["max_lora_rank"] >= 8  # TrainerConfig's default rank


@pytest.mark.asyncio
async def test_the_vllm_settings_pass_through_the_engine(tmp_path: Path) -> None:
    """`VLLMEngine(llm_kwargs=vllm_llm_kwargs())` builds `LLM(model, enable_lora=True, **kwargs)` (on the stub), and
    a LoRA of the trainer's default rank fits its max_lora_rank."""
    import fakes.vllm_stub as stub
    from rl.models import TinyModelConfig, build_tiny_model, load_tokenizer
    from rl.samplers.vllm import VLLMEngine
    from rl.storage.artifacts import LocalArtifacts
    from rl.trainer.config import TrainerConfig
    from rl.trainer.peft_trainer import PeftTrainer
    from rl.types import Prompt, RolloutRequest

    # As long as VLLM_MODEL's positions: vllm_llm_kwargs' max_model_len is that model's, and vLLM refuses a longer one.
    config = TinyModelConfig(seed=1, hidden_size=32, intermediate=64, max_position=gpu.VLLM_MODEL.max_position)
    base = build_tiny_model(tmp_path / "model", config)
    artifacts = LocalArtifacts(tmp_path / "store")
    init = await PeftTrainer(open_model(base, tokenizer=False), artifacts, TrainerConfig()).init_adapter(seed=0)
    engine = VLLMEngine(
        open_model(base, tokenizer=False),
        artifacts,
        vllm_module=stub,
        llm_kwargs=gpu.vllm_llm_kwargs(),
        tokenizer=load_tokenizer(open_model(base, weights=False)),
    )
    group = await engine.generate(
        RolloutRequest(
            group_id=0,
            prompt=Prompt(question="3=", answer="4"),
            n=2,
            adapter=init.adapter,
            policy_version=0,
            seed=1,
            max_tokens=3,
        )
    )
    assert len(group) == 2
    given = dict(engine.llm.init_kwargs)
    staged = Path(given.pop("model"))  # the checked opener's private copy of `base` (docs/guarantees.md)
    assert staged != base and (staged / "config.json").read_bytes() == (base / "config.json").read_bytes()
    fixed = {"enable_lora": True, "logprobs_mode": "processed_logprobs", "trust_remote_code": False}
    assert given == {**fixed, **gpu.vllm_llm_kwargs()}


@pytest.mark.parametrize("kwargs_of", [gpu.vllm_llm_kwargs, gpu.vllm_cpu_llm_kwargs], ids=["gpu", "cpu"])
def test_the_stub_takes_every_keyword_our_vllm_settings_pass(kwargs_of: Any, tmp_path: Path) -> None:
    """The stub refuses a keyword that is not in its `ENGINE_ARGS` (as vLLM refuses non-fields); a keyword added to
    our settings must be added there too (`nox -s vllm-api` checks the list against vLLM), or the stub-beside-real
    tests fail only in `nox -s vllm-cpu`."""
    import fakes.vllm_stub as stub
    from rl.models import TinyModelConfig, build_tiny_model
    from rl.samplers.vllm_requests import engine_llm_kwargs

    config = TinyModelConfig(seed=1, hidden_size=32, intermediate=64, max_position=gpu.VLLM_MODEL.max_position)
    base = build_tiny_model(tmp_path / "model", config)
    kwargs = engine_llm_kwargs(base, kwargs_of())
    assert set(kwargs) - {"model"} <= set(stub.ENGINE_ARGS), sorted(set(kwargs) - set(stub.ENGINE_ARGS))
    assert stub.LLM(**kwargs).init_kwargs == kwargs
    with pytest.raises(TypeError, match="unexpected keyword arguments \\['swap_space_gb'\\]"):
        stub.LLM(**kwargs, swap_space_gb=4)


def test_a_vllm_engine_spec_takes_its_length_from_the_model(tmp_path: Path) -> None:
    """`EngineSpec(kind="vllm")` asks vLLM for the model's own length: a fixed 2048 was longer than the tiny model's
    positions, which vLLM (and the stub) refuse."""
    import fakes.vllm_stub as stub
    from rl.deploy.flyte.config import EngineSpec
    from rl.deploy.flyte.grpo_tasks import _make_engine
    from rl.errors import ConfigError
    from rl.models import TinyModelConfig, build_tiny_model

    base = build_tiny_model(tmp_path / "model", TinyModelConfig(seed=1, hidden_size=32, intermediate=64))
    engine = _make_engine(base, EngineSpec(kind="vllm"))
    engine._vllm = stub  # type: ignore[attr-defined]
    assert engine.llm.max_model_len == TinyModelConfig().max_position  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match="exceeds the model's 128 positions"):
        _make_engine(base, EngineSpec(kind="vllm", max_model_len=2048))


def test_rollout_tasks_make_vllm_spawn_its_engine_process() -> None:
    """Forking a threaded process can hang vLLM's engine core; rollout tasks set the spawn start method."""
    from rl.deploy.flyte.envs import rollout_env

    assert rollout_env.env_vars["VLLM_WORKER_MULTIPROC_METHOD"] == "spawn"


def test_gpu_smoke_trains_at_the_rate_the_cuda_trainer_test_measured() -> None:
    """gpu_tests/test_cuda_trainer.py records that the CPU demo's lr 1e-2 overshoots on VLLM_MODEL; gpu-smoke trains
    that model, so it uses the rate that test uses."""
    from rl.deploy.flyte.config import gpu_smoke

    source = (Path(__file__).parents[1] / "gpu_tests" / "test_cuda_trainer.py").read_text()
    [measured] = re.findall(r"^CONFIG = TrainerConfig\(lr=([0-9.e-]+)", source, flags=re.M)
    assert gpu_smoke().trainer.lr == float(measured)


def test_an_existing_nccl_group_computes_on_the_ranks_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """A process group made before the task (torchrun's, a launcher's) that runs NCCL reduces only CUDA tensors, so
    the rank's device is its bound GPU, not "cpu" (which every collective of the step would then fail on)."""
    import torch
    import torch.distributed as dist

    from rl.deploy.flyte.clustered import join_process_group

    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_rank", lambda: 3)
    monkeypatch.setattr(dist, "get_world_size", lambda: 4)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    monkeypatch.setattr(dist, "get_backend", lambda: "nccl")
    assert join_process_group() == (3, 4, "cuda:1", False)
    monkeypatch.setattr(dist, "get_backend", lambda: "gloo")
    assert join_process_group() == (3, 4, "cpu", False)


def test_a_rank_loads_the_base_straight_onto_its_device(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Each clustered rank used to read the base in float32 into host memory and move it after (~33 GB per rank for
    an 8 B model); the weights must be read onto the rank's device directly."""
    import torch

    import rl.models.tiny as tiny
    import rl.trainer.adapter as adapter
    from rl.models import TinyModelConfig, build_tiny_model
    from rl.trainer.adapter import ADAPTER_FILES, load_policy

    base = build_tiny_model(tmp_path / "model", TinyModelConfig(seed=1, hidden_size=32, intermediate=64))
    asked: dict[str, object] = {}

    class Stop(Exception):
        pass

    def from_pretrained(path: str, **kwargs: object) -> None:
        asked.update(kwargs)
        raise Stop

    monkeypatch.setattr(tiny.AutoModelForCausalLM, "from_pretrained", from_pretrained)
    monkeypatch.setattr(adapter, "check_adapter_files", lambda *args: None)  # the adapter's bytes are not read here
    with pytest.raises(Stop):
        load_policy(
            open_model(base, tokenizer=False), dict.fromkeys(ADAPTER_FILES, b""), trainable=True, device="cuda:1"
        )
    assert asked["device_map"] == "cuda:1" and asked["dtype"] == torch.float32


def _a_pod_given_a_gpu_on_an_r570_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    """A GPU pod (the device plugin's NVIDIA_VISIBLE_DEVICES) whose driver 570 is too old for torch's CUDA 13: torch
    then reports no CUDA, exactly as a cu130 wheel does there."""
    import torch

    import rl.gpu

    monkeypatch.setenv("NVIDIA_VISIBLE_DEVICES", "GPU-0f3c")
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(rl.gpu, "nvidia_driver_version", lambda *a, **k: "570.86.15")


def test_a_train_task_given_a_gpu_it_cannot_use_refuses_naming_the_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    """It used to train on the CPU (torch.cuda.is_available() False) until its 30-minute timeout, three times over."""
    from rl.deploy.flyte.grpo_tasks import train_device
    from rl.errors import CudaUnavailableError, RlError

    _a_pod_given_a_gpu_on_an_r570_driver(monkeypatch)
    with pytest.raises(CudaUnavailableError) as refused:
        train_device()
    message = str(refused.value)
    assert "570.86.15" in message and "R580" in message and "\n" not in message, message
    assert isinstance(refused.value, RlError)


def test_a_clustered_rank_given_a_gpu_it_cannot_use_refuses_instead_of_joining_gloo(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import torch.distributed as dist

    from rl.deploy.flyte.clustered import join_process_group
    from rl.errors import CudaUnavailableError

    _a_pod_given_a_gpu_on_an_r570_driver(monkeypatch)
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    joined: list[str] = []
    monkeypatch.setattr(dist, "init_process_group", lambda backend, **kw: joined.append(backend))
    with pytest.raises(CudaUnavailableError, match=r"570\.86\.15.*R580|R580.*570\.86\.15"):
        join_process_group()
    assert joined == []


def test_a_task_given_no_gpu_computes_on_the_cpu(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A CPU pod or Flyte's local mode on a laptop: no assigned GPU, no NVIDIA driver."""
    import rl.gpu
    from rl.deploy.flyte.grpo_tasks import train_device

    monkeypatch.delenv("NVIDIA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(rl.gpu, "nvidia_driver_version", lambda *a, **k: None)
    assert train_device() == "cpu"
    monkeypatch.setenv("NVIDIA_VISIBLE_DEVICES", "void")  # the container toolkit's "no GPU"
    assert train_device() == "cpu"


@pytest.mark.heavy
def test_the_cuda_round_trip_compares_the_step_compute_step_runs_on_the_cpu(tmp_path: Path) -> None:
    """gpu_tests/test_cuda_trainer.py's round trip, run here on the CPU: its in-memory step must run the loss
    `compute_step` runs (`run_step`'s batched loss), or the byte comparison fails on every device (the per-sample loss
    it used to run differs from the batched one in the last bits)."""
    import asyncio

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gpu_tests"))
    try:
        from gpu_helpers import base_rollouts, round_trip_step, varied_rewards
    finally:
        sys.path.pop(0)
    from rl.models import build_tiny_model
    from rl.trainer.config import TrainerConfig
    from rl.types import TrainBatch

    def fixed_batch(base_dir: Path, artifacts: object, trainer: object) -> TrainBatch:
        rollouts = base_rollouts(base_dir, groups=2, samples=4, max_tokens=6, seed=5)
        init = asyncio.run(trainer.init_adapter(seed=3))  # type: ignore[attr-defined]
        return TrainBatch(
            step=0, rollouts=rollouts, rewards=varied_rewards(rollouts), adapter=init.adapter,
            optimizer_state=init.optimizer_state, new_version=1,
        )  # fmt: skip

    model_dir = build_tiny_model(tmp_path / "model", gpu.VLLM_MODEL)
    config = TrainerConfig(lr=1e-3, threads=1)
    numbers = round_trip_step(model_dir, tmp_path, config, "cpu", fixed_batch)
    assert numbers["adapter_bytes"] > 0
