"""The trainer as a detached, namespaced Ray actor, against a real local Ray (`nox -s ray`).

The agentic tutorial: "all three training steps report the same actor PID even though the driver died between steps 1
and 2". Each driver attempt here is its own process that connects to the cluster, as a retried driver task would.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid

import pytest

from rl.errors import StepPayloadConflictError, TrainerMismatchError
from rl.types import Reward

pytestmark = pytest.mark.ray

WORLDS = ["w0", "w1"]

# One driver attempt: attach by name, run the given training steps through the real trainer tier, maybe crash.
DRIVER_ATTEMPT = r"""
import asyncio, json, os, sys
import ray
from rl.agentic.ray_trainer import attach_ray_trainer
from rl.agentic.tiers import TrainerTier
from rl.types import Reward

address, name, namespace, steps, crash = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4]), sys.argv[5]
ray.init(address=address, include_dashboard=False, log_to_driver=False)
tier = TrainerTier(lambda worlds: attach_ray_trainer(worlds, name=name, namespace=namespace))
worlds = ["w0", "w1"]

def rewards(step):
    return [Reward(trial_id=f"s{step}-p{p}", world_id=worlds[p % 2], verified_correct=True, n_turns=2,
                   judge_score=1.3, reward=2.3, found_doc=(step + p) % 8) for p in range(3)]

async def main():
    await tier.setup_trainer(worlds)
    for step in steps:
        result = await tier.train_step(step, rewards(step), worlds, 2.0)
        print(json.dumps(result.model_dump()), flush=True)
    if crash == "crash":
        os._exit(17)  # the driver process dies between steps: no cleanup, no goodbye

asyncio.run(main())
"""


@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray", reason="install the `ray` extra (nox -s ray)")
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


def _driver_attempt(address: str, name: str, namespace: str, steps: list[int], crash: bool) -> tuple[int, list[dict]]:
    argv = [
        sys.executable,
        "-c",
        DRIVER_ATTEMPT,
        address,
        name,
        namespace,
        json.dumps(steps),
        "crash" if crash else "-",
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=180)
    results = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert done.returncode == (17 if crash else 0), done.stderr[-2000:]
    return done.returncode, results


def test_the_detached_trainer_survives_a_driver_crash_between_steps_and_keeps_one_identity(ray_cluster):
    """The agentic tutorial: "A detached, namespaced actor does [survive] — across steps, across step retries, and
    across driver crashes"; "all three training steps report the same actor PID"."""
    from rl.agentic.ray_trainer import attach_ray_trainer, kill_ray_trainer

    name, namespace = "policy", f"test-{uuid.uuid4().hex[:8]}"
    try:
        _, before = _driver_attempt(ray_cluster, name, namespace, [0, 1], crash=True)
        # attempt 2 replays step 1 (the step the dead driver may not have recorded) and runs step 2
        _, after = _driver_attempt(ray_cluster, name, namespace, [1, 2], crash=False)
        assert [r["step"] for r in before + after] == [0, 1, 1, 2]
        assert len({r["actor_pid"] for r in before + after}) == 1
        assert after[0]["weights"] == before[1]["weights"]  # the replayed step returned its recorded weights
        info = attach_ray_trainer(WORLDS, name=name, namespace=namespace).info()
        assert info.applied_steps == [0, 1, 2] and info.version == 3 and info.identity == before[0]["actor_pid"]
    finally:
        kill_ray_trainer(name=name, namespace=namespace)


def test_the_ray_trainer_refuses_a_conflicting_payload_and_other_worlds(ray_cluster):
    """Issue 6: "the same step id with a different payload is an error, not a silent second update"."""
    from rl.agentic.ray_trainer import attach_ray_trainer, kill_ray_trainer

    name, namespace = "policy", f"test-{uuid.uuid4().hex[:8]}"
    reward = Reward(
        trial_id="a", world_id="w0", verified_correct=True, n_turns=1, judge_score=1.2, reward=2.2, found_doc=3
    )
    try:
        trainer = attach_ray_trainer(WORLDS, name=name, namespace=namespace)
        first = trainer.update(0, [reward], 2.0)
        assert trainer.update(0, [reward], 2.0) == first
        with pytest.raises(StepPayloadConflictError, match="step 0 was already applied"):
            trainer.update(0, [reward], 3.0)
        with pytest.raises(TrainerMismatchError):
            attach_ray_trainer(["w0"], name=name, namespace=namespace)
        assert trainer.info().applied_steps == [0] and trainer.weights().version == 1
    finally:
        kill_ray_trainer(name=name, namespace=namespace)
