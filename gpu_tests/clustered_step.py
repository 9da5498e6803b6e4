"""Production's clustered train step in a one-rank torchrun, through the entry a Flyte pod runs: shared by
gpu_tests/test_clustered_nccl.py (NCCL on cuda:0, in the device check) and tests/test_device_check_clustered.py (gloo
on the CPU), so both run the same launcher, worker and checks and differ only in the device the rank finds.

`torchrun --standalone --nproc-per-node 1` runs `tests/clustered_torchrun_worker.py`, which calls Flyte's
`load_and_run_task` on `rl.deploy.flyte.clustered.train_step_clustered` as the `clustered` launcher's `a0` does: the
rank joins the process group (`join_process_group`: NCCL on the GPU `task_device` gives it, gloo on a CPU), waits for
local rank 0's download of the base on a gloo group beside the NCCL default group (`node_base`), runs `ddp_train_step`
and publishes from rank 0.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
WORKER = REPO / "tests" / "clustered_torchrun_worker.py"  # the CPU tests' worker: one worker for both
HANG_BOUND_S = 240  # only bounds a hang: the run is killed with its worker and the test fails


def _dir_input(path: Path) -> Any:
    from flyte.io import Dir

    from rl.storage.artifacts import compute_digest, read_dir

    return Dir.from_existing_remote(str(path), dir_cache_key=compute_digest(read_dir(path)))


def _inputs(root: Path, base_dir: Path, batch: Any, store: Any, config: Any) -> Path:
    """The clustered task's Flyte inputs file for `batch` (its adapter and optimizer state written as Dirs)."""
    from flyte._internal.runtime.convert import convert_from_native_to_inputs
    from flyte._internal.runtime.io import upload_inputs

    from rl.deploy.flyte.clustered import train_step_clustered
    from rl.deploy.flyte.grpo_tasks import TrainInput
    from rl.storage.artifacts import write_files

    adapter_dir, optimizer_dir = root / "adapter-in", root / "optimizer-in"
    write_files(asyncio.run(store.get(batch.adapter)), adapter_dir)
    write_files(asyncio.run(store.get(batch.optimizer_state)), optimizer_dir)
    native = {
        "base": _dir_input(base_dir),
        "adapter": _dir_input(adapter_dir),
        "optimizer_state": _dir_input(optimizer_dir),
        "batch": TrainInput.of(batch, config),
    }
    inputs = root / "inputs.pb"
    literal = asyncio.run(convert_from_native_to_inputs(train_step_clustered.native_interface, **native))
    asyncio.run(upload_inputs(literal, str(inputs)))
    return inputs


def _read_output(outputs: Path) -> Any:
    from flyte._internal.runtime.convert import convert_outputs_to_native
    from flyte._internal.runtime.io import load_outputs

    from rl.deploy.flyte.clustered import train_step_clustered

    loaded = asyncio.run(load_outputs(str(outputs / "outputs.pb")))
    return asyncio.run(convert_outputs_to_native(train_step_clustered.native_interface, loaded))


def one_rank_clustered_step(base_dir: Path, root: Path, device: str) -> dict[str, object]:
    """Step 2 of a fixed batch (4 groups of 3, one silent; after a first step, so LoRA's B is non-zero) through
    production's clustered entry on one rank, checked against `PeftTrainer`'s step on `device`: the rank joined a world
    of 1 on `device` with NCCL (gloo on the CPU), local rank 0 downloaded the base once, rank 0 published the adapter
    and optimizer state, and the published adapter equals the single-process step's (rtol 1e-4, atol 1e-6; each tensor
    moved by more). Returns numbers for the report."""
    import torch
    from gpu_helpers import base_rollouts, run_marked, varied_rewards
    from safetensors.torch import load as load_safetensors

    from rl.models.opened_model import open_model
    from rl.storage.artifacts import LocalArtifacts, compute_digest, read_dir
    from rl.trainer.config import TrainerConfig
    from rl.trainer.peft_trainer import PeftTrainer
    from rl.types import TrainBatch

    config = TrainerConfig(lr=1e-3, lora_rank=4, lora_alpha=8, seed=3, threads=1)
    store = LocalArtifacts(root / "store")
    trainer = PeftTrainer(open_model(base_dir), store, config, device=torch.device(device))
    init = asyncio.run(trainer.init_adapter(seed=5))
    rollouts = base_rollouts(base_dir, groups=4, samples=3, max_tokens=6, seed=31)
    rewards = varied_rewards(rollouts, silent_groups=[2])
    first = TrainBatch(0, rollouts, rewards, init.adapter, init.optimizer_state, new_version=1)
    v1 = asyncio.run(trainer.train_step(first))
    batch = TrainBatch(1, rollouts, rewards, v1.adapter, v1.optimizer_state, new_version=2)
    inputs = _inputs(root, base_dir, batch, store, config)

    run, events = root / "run", root / "run" / "events.jsonl"
    (run / "outputs").mkdir(parents=True)  # an object-store prefix on a cluster; a local directory must exist
    (run / "tmp").mkdir()
    env = {
        **os.environ,
        "TMPDIR": str(run / "tmp"),
        "RL_NODE_CACHE": str(run / "cache"),
        "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p),
    }
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1", "--max-restarts=0",
        "--monitor-interval=0.5", str(WORKER), str(inputs), str(run / "outputs"), str(run / "raw"), str(events),
    ]  # fmt: skip
    start = time.monotonic()
    proc = run_marked(cmd, env=env, timeout_s=HANG_BOUND_S, cwd=run)
    torchrun_s = time.monotonic() - start
    logs = f"--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-8000:]}"
    assert proc.returncode == 0, f"torchrun exit {proc.returncode}\n{logs}"
    seen = [json.loads(line) for line in events.read_text().splitlines()] if events.is_file() else []

    def of(kind: str) -> list[dict[str, Any]]:
        return [e for e in seen if e["event"] == kind]

    backend = "nccl" if device.startswith("cuda") else "gloo"
    assert [(e["rank"], e["world_size"], e["device"], e["backend"]) for e in of("joined")] == [
        (0, 1, device, backend)
    ], logs
    assert [e["local_rank"] for e in of("download") if e["path"] == str(base_dir)] == [0], seen
    assert [(e["rank"], e["name"]) for e in of("publish")] == [(0, "adapter-v2"), (0, "optimizer-v2")], seen

    output = _read_output(run / "outputs")
    single = asyncio.run(trainer.train_step(batch))
    assert output.policy_version == 2 and output.metrics.contributing == single.metrics.contributing == 9, (
        output.metrics
    )
    assert abs(output.metrics.loss - single.metrics.loss) <= 1e-6, (output.metrics, single.metrics)
    assert abs(output.metrics.grad_norm - single.metrics.grad_norm) <= 1e-4 * single.metrics.grad_norm
    files = read_dir(Path(output.adapter.path))
    assert output.adapter.hash == compute_digest(files)
    got = load_safetensors(files["adapter_model.safetensors"])
    want = load_safetensors(asyncio.run(store.get(single.adapter))["adapter_model.safetensors"])
    before = load_safetensors(asyncio.run(store.get(v1.adapter))["adapter_model.safetensors"])
    assert got.keys() == want.keys() and want
    for key in want:
        assert not torch.equal(want[key], before[key]), f"{key} did not move: the comparison would be vacuous"
        torch.testing.assert_close(got[key], want[key], rtol=1e-4, atol=1e-6)
    return {"backend": backend, "torchrun_s": round(torchrun_s, 1), "loss": round(output.metrics.loss, 6)}
