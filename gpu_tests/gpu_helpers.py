"""Helpers for the GPU tests (imported by name: pytest puts gpu_tests/ on sys.path): requirement checks, fixed batches,
random adapters, and the log-prob comparison between vLLM and the trainer.

Everything that decides a test's inputs runs on the CPU from seeds (the batches are sampled from the float32 base model
with `rl.samplers.decoding.sample_group`), so a test's inputs are the same on every machine and only the code under
test runs on the GPU.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import asyncio
import math
import statistics
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from rl.gpu import cuda_unavailable_reason, strict, vllm_unavailable_reason
from rl.models.opened_model import open_model
from rl.types import Rollout

# ---------------------------------------------------------------------------------------------------------------------
# Requirements: skip with the precise reason, or fail under RL_GPU_STRICT=1


def missing_requirement(min_gpus: int = 1, *, needs_vllm: bool = False) -> tuple[str, bool] | None:
    """What this machine lacks for a test needing `min_gpus` GPUs (and vllm): (reason, whether RL_GPU_STRICT=1 makes it
    a failure), or None. No CUDA at all and no vllm can fail; too few GPUs only ever skips."""
    reason = cuda_unavailable_reason(1)
    if reason is not None:
        return reason, True
    reason = cuda_unavailable_reason(min_gpus)
    if reason is not None:
        return reason, False
    reason = vllm_unavailable_reason() if needs_vllm else None
    return (reason, True) if reason is not None else None


def _missing(reason: str, *, may_fail: bool) -> None:
    if may_fail and strict():
        pytest.fail(f"{reason} [RL_GPU_STRICT=1: this machine must provide it]", pytrace=False)
    pytest.skip(reason)


def requires_cuda() -> None:
    """Skip (fail under RL_GPU_STRICT=1) unless CUDA is usable."""
    reason = cuda_unavailable_reason(1)
    if reason is not None:
        _missing(reason, may_fail=True)


def requires_gpus(n: int) -> None:
    """Skip unless `n` CUDA GPUs are visible (under RL_GPU_STRICT=1, no CUDA at all fails; too few GPUs skips)."""
    requires_cuda()
    reason = cuda_unavailable_reason(n)
    if reason is not None:
        _missing(reason, may_fail=False)


def requires_vllm() -> None:
    """Skip (fail under RL_GPU_STRICT=1) unless vllm is installed."""
    reason = vllm_unavailable_reason()
    if reason is not None:
        _missing(reason, may_fail=True)


# ---------------------------------------------------------------------------------------------------------------------
# Fixed inputs, sampled on the CPU


def digit_prompt(d: int) -> tuple[str, str]:
    """The digit task's prompt and answer (`rl.problems.DigitSuccessor`)."""
    return f"{d % 10}=", str((d + 1) % 10)


def base_rollouts(
    base_dir: Path, *, groups: int, samples: int, max_tokens: int, seed: int, policy_version: int = 0
) -> list[Rollout]:
    """`groups` x `samples` rollouts of the digit prompts sampled from the float32 base model on the CPU.

    The base model is what a version-0 adapter samples (PEFT initialises LoRA's B to zero), so these are exactly the
    rollouts, token ids and sampling log-probs a sampler of version 0 records: the first step's ratios are 1.
    """
    from rl.models import load_base_model, load_tokenizer
    from rl.samplers.decoding import sample_group

    tokenizer = load_tokenizer(open_model(base_dir))
    model = load_base_model(open_model(base_dir))
    rollouts = []
    for g in range(groups):
        question, answer = digit_prompt(g)
        prompt_ids = [int(t) for t in tokenizer(question)["input_ids"]]
        group_seed = seed * 1000 + g
        for s in sample_group(
            model, prompt_ids, n=samples, max_tokens=max_tokens, seed=group_seed, eos_token_id=tokenizer.eos_token_id
        ):
            rollouts.append(
                Rollout(
                    group_id=g,
                    question=question,
                    answer=answer,
                    completion=str(tokenizer.decode(s.token_ids, skip_special_tokens=True)),
                    prompt_token_ids=prompt_ids,
                    token_ids=s.token_ids,
                    logprobs=s.logprobs,
                    policy_version=policy_version,
                    seed=group_seed,
                )
            )
    return rollouts


def varied_rewards(rollouts: Sequence[Rollout], silent_groups: Sequence[int] = ()) -> list[float]:
    """Rewards that differ within every group except `silent_groups` (all 0.5 there: no signal).

    Within a group the rewards cycle through 1/8, 1/4, 1/2, 1 (offset by the group id), so for groups of up to 4
    samples no member equals its group's mean and every advantage outside the silent groups is non-zero.
    """
    return [
        0.5 if r.group_id in silent_groups else 2.0 ** ((i * 7 + r.group_id) % 4) / 8.0 for i, r in enumerate(rollouts)
    ]


def random_adapter(base_dir: Path, *, seed: int, scale: float = 0.05, lora_rank: int = 8) -> dict[str, bytes]:
    """A LoRA adapter (the trainer's layout: rank `lora_rank`, every linear layer) with every A and B entry drawn from
    N(0, scale^2) under `seed`: a stand-in for a trained version whose log-probs differ visibly from any other's."""
    import torch

    from rl.trainer.adapter import adapter_files, new_adapter, trainable_parameters
    from rl.trainer.config import TrainerConfig

    config = TrainerConfig(lora_rank=lora_rank, lora_alpha=2 * lora_rank)
    model = new_adapter(open_model(base_dir), config, seed)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in trainable_parameters(model):
            p.copy_(scale * torch.randn(p.shape, generator=generator))
    return adapter_files(model)


# ---------------------------------------------------------------------------------------------------------------------
# vLLM's sampling log-probs against the trainer's teacher-forced log-probs


def trainer_policy(base_dir: Path, adapter: dict[str, bytes], device: Any) -> Any:
    """The trainer's view of an adapter: float32 base + LoRA (unmerged PEFT forward), frozen, on `device`."""
    from rl.trainer.adapter import load_policy

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=FutureWarning)
        model = load_policy(open_model(base_dir), adapter, trainable=False, device=device)
    model.eval()
    return model


def logprob_gaps(rollouts: Sequence[Rollout], policy: Any) -> list[float]:
    """|sampling log-prob - teacher-forced log-prob under `policy`| for every completion token of `rollouts`."""
    import torch

    from rl.samplers.decoding import teacher_forced_logprobs

    gaps: list[float] = []
    with torch.no_grad():
        for r in rollouts:
            forced = teacher_forced_logprobs(policy, r.prompt_token_ids, r.token_ids).double().cpu()  # [T]
            sampled = torch.tensor(r.logprobs, dtype=torch.float64)  # [T]
            gaps.extend((sampled - forced).abs().tolist())
    return gaps


@dataclass(frozen=True)
class GapSummary:
    tokens: int
    mean: float
    max: float

    def __str__(self) -> str:
        return f"mean |Δ| {self.mean:.4f}, max |Δ| {self.max:.4f} over {self.tokens} tokens"


def summarize(gaps: Sequence[float]) -> GapSummary:
    if not gaps:
        raise ValueError("no tokens to compare; the rollouts have empty completions")
    if not all(math.isfinite(g) for g in gaps):
        raise AssertionError(f"non-finite log-prob gap among {len(gaps)} tokens")
    return GapSummary(tokens=len(gaps), mean=statistics.fmean(gaps), max=max(gaps))


# ---------------------------------------------------------------------------------------------------------------------
# The adapter and AdamW state round trip, on any device


def _state_tensors(optimizer: Any) -> dict[str, Any]:
    import torch

    return {
        f"{index}.{key}": value
        for index, state in optimizer.state_dict()["state"].items()
        for key, value in state.items()
        if isinstance(value, torch.Tensor)
    }


def round_trip_step(base_dir: Path, tmp_path: Path, config: Any, device: Any, fixed_batch: Any) -> dict[str, object]:
    """Step 1 in memory on `device`, save, load back: every LoRA weight and moment bitwise equal and on its device,
    saving again identical bytes; step 2 continued in memory, from the saved artifacts (`compute_step`) and replayed:
    identical bytes. Each step runs `run_step`, the loss `compute_step` runs (the batched one). Returns numbers
    for the report; `fixed_batch(base_dir, artifacts, trainer)` builds the batch."""
    import time
    from dataclasses import replace

    import torch

    from rl.storage.artifacts import LocalArtifacts
    from rl.trainer.adapter import adapter_files, load_policy, trainable_parameters
    from rl.trainer.optimizer_state import build_optimizer, optimizer_files
    from rl.trainer.peft_trainer import PeftTrainer
    from rl.trainer.step import pinned_threads, prepare_step, run_step

    artifacts = LocalArtifacts(tmp_path / "store")
    trainer = PeftTrainer(open_model(base_dir), artifacts, config, device=device)
    batch = fixed_batch(base_dir, artifacts, trainer)
    v0_adapter = asyncio.run(artifacts.get(batch.adapter))
    v0_opt = asyncio.run(artifacts.get(batch.optimizer_state)) if batch.optimizer_state else None
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)

    prepared = prepare_step(open_model(base_dir), batch, config, v0_adapter, v0_opt, device=device)
    assert all(p.device.type == torch.device(device).type for _, p in prepared.params)

    def step_in_memory(step_batch: Any) -> None:
        with pinned_threads(config.threads):  # as compute_step: CPU reductions depend on the thread count
            run_step(step_batch, prepared, config)

    step_in_memory(batch)
    names = [name for name, _ in prepared.params]
    saved_adapter = adapter_files(prepared.model)
    saved_opt = optimizer_files(prepared.optimizer, names)

    loaded = load_policy(open_model(base_dir), saved_adapter, trainable=True, device=device)
    loaded.train()
    loaded_params = trainable_parameters(loaded)
    loaded_opt = build_optimizer(loaded_params, config, saved_opt)
    assert [name for name, _ in loaded_params] == names
    for (name, original), (_, restored) in zip(prepared.params, loaded_params, strict=True):
        assert restored.device == original.device, name
        assert torch.equal(restored, original), f"LoRA weight {name} changed in the round trip"
    original_state, restored_state = _state_tensors(prepared.optimizer), _state_tensors(loaded_opt)
    assert original_state.keys() == restored_state.keys() and len(original_state) == 3 * len(names)
    for key, original in original_state.items():
        assert restored_state[key].device == original.device, key
        assert torch.equal(restored_state[key], original), f"optimizer state {key} changed in the round trip"
    assert adapter_files(loaded) == saved_adapter
    assert optimizer_files(loaded_opt, names) == saved_opt

    second = replace(batch, step=1)
    step_in_memory(second)
    in_memory = (adapter_files(prepared.model), optimizer_files(prepared.optimizer, names))
    start = time.perf_counter()
    from_artifacts = trainer.compute_step(second, saved_adapter, saved_opt)
    sync()
    step_s = time.perf_counter() - start
    replayed = trainer.compute_step(second, saved_adapter, saved_opt)
    assert from_artifacts[:2] == replayed[:2], "replaying a step from the same artifacts changed its bytes"
    assert from_artifacts[0] == in_memory[0], "the step after a round trip differs from continuing in memory (adapter)"
    assert from_artifacts[1] == in_memory[1], "the step after a round trip differs from continuing in memory (AdamW)"
    return {"adapter_bytes": len(saved_adapter["adapter_model.safetensors"]), "step_s": round(step_s, 3)}


# ---------------------------------------------------------------------------------------------------------------------
# torchrun over gpu_tests/ddp_nccl_worker.py

REPO = Path(__file__).resolve().parent.parent
WORKER = Path(__file__).resolve().parent / "ddp_nccl_worker.py"
RUN_TIMEOUT_S = 300


def run_marked(command: list[str], *, env: dict[str, str], timeout_s: float, cwd: Path) -> Any:
    """`subprocess.run(command)` capturing its output, except that every process it started is killed when it ends,
    by timeout or failure: torchrun's workers run in sessions of their own (setsid), out of reach of a kill of torchrun
    or of its process group (`process_tree`). A timeout fails the test with the output so far."""
    import subprocess
    import tempfile

    from process_tree import kill_marked, marked_env, new_mark

    mark = new_mark()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(command, env=marked_env(env, mark), stdout=out, stderr=err, text=True, cwd=cwd)
        timed_out = False
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            kill_marked(mark)  # also on success: a worker left behind would hold the GPU for the next test
            proc.wait()
        out.seek(0)
        err.seek(0)
        done = subprocess.CompletedProcess(command, proc.returncode, out.read(), err.read())
    if timed_out:
        pytest.fail(
            f"{command[2:5]} ran past {timeout_s:.0f} s; killed with every worker\n--- stdout\n{done.stdout[-4000:]}"
            f"\n--- stderr\n{done.stderr[-8000:]}",
            pytrace=False,
        )
    return done


def torchrun(job: dict[str, Any], tmp_path: Path, world: int = 2) -> list[dict[str, Any]]:
    """Run `ddp_nccl_worker.py` on `world` ranks under torchrun with `job` (see the worker); each rank's results, or
    the test fails with the ranks' output."""
    import pickle
    import shutil
    import sys

    job_path, out_dir = tmp_path / "job.pkl", tmp_path / "out"
    out_dir.mkdir()
    job_path.write_bytes(pickle.dumps(job))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("HF_HUB_OFFLINE", "1")
    # Containers often give /dev/shm 64 MB, too little for NCCL's shared-memory transport (a hang or "unhandled
    # system error"); fall back to its socket/P2P paths there.
    shm = Path("/dev/shm")
    if not shm.is_dir() or shutil.disk_usage(shm).total < 512 * 2**20:
        env.setdefault("NCCL_SHM_DISABLE", "1")
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={world}",
        str(WORKER),
        str(job_path),
        str(out_dir),
    ]
    proc = run_marked(command, env=env, timeout_s=RUN_TIMEOUT_S, cwd=REPO)
    per_rank = []
    for rank in range(world):
        path = out_dir / f"rank{rank}.pkl"
        if not path.is_file():
            pytest.fail(
                f"rank {rank} wrote no result (torchrun exit {proc.returncode})\n--- stdout\n{proc.stdout[-4000:]}"
                f"\n--- stderr\n{proc.stderr[-8000:]}",
                pytrace=False,
            )
        per_rank.append(pickle.loads(path.read_bytes()))
    for rank_out in per_rank:
        for value in rank_out.values():
            if isinstance(value, Exception):
                raise value
    assert proc.returncode == 0, proc.stderr[-8000:]
    return per_rank
