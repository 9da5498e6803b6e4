"""The clustered trainer's real task body under torchrun: two "nodes" on localhost (`--nnodes 2 --nproc-per-node 2`,
c10d rendezvous on 127.0.0.1, gloo), each worker running `train_step_clustered` through Flyte's own task runner
(`clustered_torchrun_worker.py`), as the `clustered` launcher runs it in a JobSet's pods.

Each node gets its own TMPDIR and base-model cache, as each pod has its own disk. What the issue asks of the step:
every rank joins one world of 4; only local rank 0 of each node downloads the base model; global rank 0 alone
publishes the adapter and optimizer state, and Flyte writes the output from rank 0 alone; the published adapter equals
the single-process step's on the same batch; and a rank SIGKILLed mid-step fails the step with nothing published, so
the retry (a fresh torchrun on the same output and raw-data paths, as a JobSet restart) starts clean and succeeds.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from fixtures_real import TEST_MODEL_CONFIG
from safetensors.torch import load as load_safetensors
from trainer_batches import make_batch, make_rollouts, varied_rewards

from rl.models import build_tiny_model
from rl.models.opened_model import open_model
from rl.storage.artifacts import LocalArtifacts, compute_digest, read_dir, write_files
from rl.trainer.config import TrainerConfig
from rl.trainer.peft_trainer import PeftTrainer
from rl.types import TrainBatch, TrainResult

pytestmark = pytest.mark.slow

WORKER = Path(__file__).with_name("clustered_torchrun_worker.py")
CONFIG = TrainerConfig(lora_rank=4, lora_alpha=8, seed=3, threads=1)
NODES, PROCS = 2, 2
HANG_BOUND_S = 600
"""Only bounds a hang (no outcome depends on it): a torchrun run that has not exited by then is killed and fails."""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Prepared:
    root: Path
    inputs: Path
    base: Path
    batch: TrainBatch
    store: LocalArtifacts
    v1: TrainResult


def _dir_input(path: Path) -> Any:
    from flyte.io import Dir

    return Dir.from_existing_remote(str(path), dir_cache_key=compute_digest(read_dir(path)))


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Prepared:
    """The tiny base model, adapter v1 after one single-process step (so LoRA B is non-zero and the compared step moves
    A as well), its optimizer state, and the next batch, serialised as the clustered task's Flyte inputs file."""
    from flyte._internal.runtime.convert import convert_from_native_to_inputs
    from flyte._internal.runtime.io import upload_inputs

    from rl.deploy.flyte.clustered import train_step_clustered
    from rl.deploy.flyte.grpo_tasks import TrainInput

    root = tmp_path_factory.mktemp("torchrun")
    base = build_tiny_model(root / "base-model", TEST_MODEL_CONFIG)
    store = LocalArtifacts(root / "store")
    trainer = PeftTrainer(open_model(base, tokenizer=False), store, CONFIG)
    init = asyncio.run(trainer.init_adapter(seed=5))
    rollouts = make_rollouts(base, groups=4, samples=3, seed=31)  # 9 contributing samples over 4 ranks: 3+2+2+2
    rewards = varied_rewards(rollouts, silent_groups=[2])
    v1 = asyncio.run(trainer.train_step(make_batch(rollouts, rewards, init.adapter, init.optimizer_state)))
    batch = make_batch(rollouts, rewards, v1.adapter, v1.optimizer_state, step=1, new_version=2)

    adapter_dir, optimizer_dir = root / "adapter-v1", root / "optimizer-v1"
    write_files(asyncio.run(store.get(v1.adapter)), adapter_dir)
    write_files(asyncio.run(store.get(v1.optimizer_state)), optimizer_dir)
    native = {
        "base": _dir_input(base),
        "adapter": _dir_input(adapter_dir),
        "optimizer_state": _dir_input(optimizer_dir),
        "batch": TrainInput.of(batch, CONFIG),
    }
    inputs = root / "inputs.pb"
    literal = asyncio.run(convert_from_native_to_inputs(train_step_clustered.native_interface, **native))
    asyncio.run(upload_inputs(literal, str(inputs)))
    return Prepared(root, inputs, base, batch, store, v1)


@dataclass
class Attempt:
    returncodes: list[int]
    events: list[dict[str, Any]]
    logs: str
    wall_s: float

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["event"] == kind]


def run_torchrun(prepared: Prepared, run: Path, attempt: str, *, kill_rank: int | None = None) -> Attempt:
    """One attempt: two torchrun agents (node 0 hosts the c10d store) on localhost; returns when both have exited."""
    port, events, rdzv_id = _free_port(), run / f"events-{attempt}.jsonl", f"{attempt}-{uuid.uuid4().hex[:8]}"
    procs = []
    (run / "outputs").mkdir(exist_ok=True)  # an object-store prefix on a cluster; a local directory must exist
    for node in range(NODES):
        node_dir = run / f"node{node}"
        (node_dir / "tmp").mkdir(parents=True, exist_ok=True)
        env = {
            **os.environ,
            "TMPDIR": str(node_dir / "tmp"),
            "RL_NODE_CACHE": str(node_dir / "cache"),
            "HF_HUB_OFFLINE": "1",
            "OMP_NUM_THREADS": "1",
            "PYTHONPATH": os.pathsep.join([str(WORKER.parent), os.environ.get("PYTHONPATH", "")]),
        }
        env.pop("RL_TEST_KILL_RANK", None)
        if kill_rank is not None:
            env["RL_TEST_KILL_RANK"] = str(kill_rank)
        cmd = [
            sys.executable, "-m", "torch.distributed.run",
            f"--nnodes={NODES}", f"--nproc-per-node={PROCS}",
            "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id={rdzv_id}",
            # Node 0 hosts the rendezvous store (as pod 0 does); the timeouts bound a lost peer, not a slow one.
            f"--rdzv-conf=is_host={1 if node == 0 else 0},join_timeout=300,read_timeout=300",
            "--max-restarts=0", "--monitor-interval=0.5",
            str(WORKER), str(prepared.inputs), str(run / "outputs"), str(run / "raw"), str(events),
        ]  # fmt: skip
        log = (run / f"{attempt}-node{node}.log").open("w")
        procs.append((subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=run), log))
    start = time.monotonic()
    codes = []
    try:
        for proc, _ in procs:
            codes.append(proc.wait(timeout=max(1.0, HANG_BOUND_S - (time.monotonic() - start))))
    finally:
        for proc, log in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            log.close()
    wall = time.monotonic() - start
    lines = events.read_text().splitlines() if events.exists() else []
    logs = "\n".join((run / f"{attempt}-node{n}.log").read_text()[-4000:] for n in range(NODES))
    return Attempt(codes, [json.loads(line) for line in lines], logs, wall)


def published(run: Path) -> list[Path]:
    """Directories under the run's raw-data path (where rank 0's uploads land)."""
    raw = run / "raw"
    return (
        sorted(p for p in raw.rglob("*") if p.is_dir() and any(c.is_file() for c in p.iterdir()))
        if raw.exists()
        else []
    )


def read_output(run: Path) -> Any:
    from flyte._internal.runtime.convert import convert_outputs_to_native
    from flyte._internal.runtime.io import load_outputs

    from rl.deploy.flyte.clustered import train_step_clustered

    outputs = asyncio.run(load_outputs(str(run / "outputs" / "outputs.pb")))
    return asyncio.run(convert_outputs_to_native(train_step_clustered.native_interface, outputs))


@pytest.fixture(scope="module")
def attempts(prepared: Prepared) -> dict[str, Attempt]:
    run = prepared.root / "run"
    run.mkdir()
    killed = run_torchrun(prepared, run, "killed", kill_rank=3)
    killed_published = published(run)
    killed_output = (run / "outputs" / "outputs.pb").exists()
    retry = run_torchrun(prepared, run, "retry")
    print(f"\ntorchrun 2 nodes x 2 ranks: killed attempt {killed.wall_s:.1f} s, clean retry {retry.wall_s:.1f} s")
    return {"killed": killed, "retry": retry, "killed_state": (killed_published, killed_output), "run": run}  # type: ignore[dict-item]


def test_a_rank_killed_mid_step_fails_the_step_and_publishes_nothing(attempts: dict[str, Any]) -> None:
    killed = attempts["killed"]
    assert [e["rank"] for e in killed.of("killed")] == [3], killed.logs
    assert all(code != 0 for code in killed.returncodes), (killed.returncodes, killed.logs)
    assert killed.of("publish") == []
    assert attempts["killed_state"] == ([], False)


def test_every_rank_joins_and_rank_0_alone_publishes(attempts: dict[str, Any]) -> None:
    retry = attempts["retry"]
    assert retry.returncodes == [0, 0], retry.logs
    assert sorted(e["rank"] for e in retry.of("joined")) == [0, 1, 2, 3]
    assert {e["world_size"] for e in retry.of("joined")} == {NODES * PROCS}
    assert [(e["rank"], e["name"]) for e in retry.of("publish")] == [(0, "adapter-v2"), (0, "optimizer-v2")]
    assert len(published(attempts["run"])) == 2


def test_only_local_rank_0_of_each_node_downloads_the_base_model(attempts: dict[str, Any], prepared: Prepared) -> None:
    """One download per node, by its local rank 0 (global ranks 0 and 2), into that node's cache; the retry finds each
    node's finished copy and downloads nothing (a killed attempt leaves no partial copy where a finished one goes)."""

    def base_downloads(attempt: Attempt) -> list[tuple[int, int]]:
        return sorted((e["rank"], e["local_rank"]) for e in attempt.of("download") if e["path"] == str(prepared.base))

    assert base_downloads(attempts["killed"]) == [(0, 0), (2, 0)]
    assert base_downloads(attempts["retry"]) == []
    for node in range(NODES):
        copies = list((attempts["run"] / f"node{node}" / "cache").iterdir())
        assert len(copies) == 1 and read_dir(copies[0]) == read_dir(prepared.base)


def test_the_clustered_step_equals_the_single_process_step(attempts: dict[str, Any], prepared: Prepared) -> None:
    """Four ranks of 3+2+2+2 samples against one process: gloo sums the ranks' float32 gradients in another order than
    one process accumulates its samples, so the adapter agrees to float32 rounding (relative 1e-5), not bit for bit;
    the single-process step itself moves every tensor by far more than that."""
    output = read_output(attempts["run"])
    single = asyncio.run(
        PeftTrainer(open_model(prepared.base, tokenizer=False), prepared.store, CONFIG).train_step(prepared.batch)
    )
    assert output.policy_version == 2
    assert output.metrics.contributing == single.metrics.contributing == 9
    assert output.metrics.loss == pytest.approx(single.metrics.loss, rel=1e-5, abs=1e-7)
    assert output.metrics.grad_norm == pytest.approx(single.metrics.grad_norm, rel=1e-5)
    got = load_safetensors(read_dir(Path(output.adapter.path))["adapter_model.safetensors"])
    want = load_safetensors(asyncio.run(prepared.store.get(single.adapter))["adapter_model.safetensors"])
    before = load_safetensors(asyncio.run(prepared.store.get(prepared.v1.adapter))["adapter_model.safetensors"])
    assert got.keys() == want.keys()
    for key in want:
        assert not torch.equal(want[key], before[key]), key
        torch.testing.assert_close(got[key], want[key], rtol=1e-5, atol=1e-6)
    assert output.adapter.hash == compute_digest(read_dir(Path(output.adapter.path)))
