"""Rollouts run where their engine can compute: vLLM on a GPU pod, the torch sampler (no device code) on a CPU pod.
A pod its engine cannot use is refused in one line when the task environments are built or a run is submitted; the
driver's rollout tier sends each engine's groups to its own pod, vLLM's several per call."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import flyte
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rl.deploy.flyte import envs, grpo_tasks
from rl.deploy.flyte.config import EngineSpec, smoke
from rl.errors import RolloutPlacementError
from rl.models.opened_model import open_model
from rl.types import ArtifactRef, Prompt, RolloutRequest

TIERS = ("gpu", "cpu", "stress")
GPU_POD = flyte.Resources(cpu=4, memory="24Gi", gpu=flyte.GPU("L4", 1))  # type: ignore[arg-type]
CPU_POD = flyte.Resources(cpu=2, memory="4Gi")


def test_the_default_profile_rolls_out_on_cpu_pods() -> None:
    """`train_rl`'s default (smoke) samples with the torch sampler: its tasks run on the CPU rollout pod."""
    spec = smoke().engine
    assert spec.kind == "torch"
    assert envs.cpu_rollout_env.resources.gpu is None
    for task in (grpo_tasks.generate_on_cpu, grpo_tasks.evaluate_on_cpu):
        assert task.parent_env_name == envs.cpu_rollout_env.name
    assert envs.cpu_rollout_env in envs.grpo_driver_env.depends_on  # deployed with the default driver


@pytest.mark.parametrize("tiers", TIERS)
def test_every_tier_gives_the_torch_sampler_a_cpu_pod_and_vllm_a_gpu(tiers: str) -> None:
    sizes = envs.sizing(tiers)
    assert envs.rollout_environment("torch", sizes).resources.gpu is None
    assert envs.rollout_environment("vllm", sizes).resources.gpu is not None
    for task in (grpo_tasks.generate, grpo_tasks.generate_groups, grpo_tasks.evaluate):
        assert task.parent_env_name == envs.rollout_env.name  # vLLM's tasks on vLLM's pod


@pytest.mark.parametrize(
    ("engine", "pod", "says"),
    [("torch", GPU_POD, "torch-sampler rollouts on a GPU pod"), ("vllm", CPU_POD, "vLLM rollouts on a CPU pod")],
)
def test_a_rollout_pod_its_engine_cannot_use_is_refused_in_one_line(engine: str, pod: Any, says: str) -> None:
    sizes = replace(envs.sizing("gpu"), **{f"{engine}_rollout": pod})
    with pytest.raises(RolloutPlacementError, match=says) as refused:
        envs.rollout_environment(engine, sizes)
    assert "\n" not in str(refused.value)


def test_vllm_is_refused_where_the_tiers_deploy_no_gpu() -> None:
    """RL_FLYTE_TIERS=cpu deploys no GPU pod: a vLLM run is refused before it is submitted, the torch one is not."""
    cpu = envs.sizing("cpu")
    with pytest.raises(RolloutPlacementError, match="needs a GPU rollout pod") as refused:
        envs.check_engine_placement("vllm", cpu)
    assert "\n" not in str(refused.value)
    envs.check_engine_placement("torch", cpu)
    envs.check_engine_placement("vllm", envs.sizing("gpu"))


def test_a_rollout_task_refuses_the_other_engine() -> None:
    with pytest.raises(RolloutPlacementError, match="'torch' sent to the vllm rollout pod"):
        grpo_tasks._on_pod(EngineSpec(kind="torch"), "vllm")


def _request(gid: int, adapter: str = "a") -> RolloutRequest:
    ref = ArtifactRef(uri=f"file:///{adapter}", digest=f"sha256:{adapter}")
    return RolloutRequest(
        group_id=gid, prompt=Prompt(question="1=", answer="2"), n=2, adapter=ref, policy_version=0, seed=gid
    )


@given(st.lists(st.sampled_from("ab"), max_size=12), st.integers(1, 5))
def test_calls_keep_every_group_in_order_with_one_adapter_each(adapters: list[str], per_call: int) -> None:
    requests = [_request(i, a) for i, a in enumerate(adapters)]
    calls = grpo_tasks.call_groups(requests, per_call)
    assert [r for call in calls for r in call] == requests
    assert all(1 <= len(call) <= per_call and len({r.adapter for r in call}) == 1 for call in calls)


@pytest.mark.asyncio
async def test_several_groups_per_call_give_each_group_what_its_own_call_gives(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The batched tier (vLLM, groups_per_call > 1) on the real VLLMEngine over the vLLM stub: the groups in request
    order, each equal to the group sampled in a call of its own (per-request seeds), in calls of at most that many."""
    import fakes.vllm_stub as stub
    from rl.models import TinyModelConfig, build_tiny_model
    from rl.samplers.vllm import VLLMEngine
    from rl.storage.artifacts import LocalArtifacts
    from rl.trainer.config import TrainerConfig
    from rl.trainer.peft_trainer import PeftTrainer

    base = build_tiny_model(tmp_path / "model", TinyModelConfig(seed=1, hidden_size=32, intermediate=64))
    artifacts = LocalArtifacts(tmp_path / "store")
    adapter = (
        await PeftTrainer(open_model(base, tokenizer=False), artifacts, TrainerConfig()).init_adapter(seed=0)
    ).adapter
    engine = VLLMEngine(open_model(base, tokenizer=False), artifacts, vllm_module=stub)
    sizes: list[int] = []

    async def generate_groups(_base: Any, _adapter: Any, requests: list[RolloutRequest], _spec: Any) -> Any:
        sizes.append(len(requests))
        return await engine.generate_groups(requests)

    monkeypatch.setattr(grpo_tasks, "generate_groups", generate_groups)
    spec = EngineSpec(kind="vllm", groups_per_call=3, max_num_seqs=6)
    tier = grpo_tasks.rollout_tier(None, spec)  # type: ignore[arg-type]  # the fake task never reads the base
    requests = [replace(_request(gid), adapter=adapter, max_tokens=3) for gid in range(7)]
    groups = await tier.generate_groups(requests)  # type: ignore[attr-defined]
    assert sorted(sizes, reverse=True) == [3, 3, 1]
    assert groups == [await engine.generate(r) for r in requests]
