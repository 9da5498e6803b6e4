"""Settings derived from the GPU a deployment names (`rl.gpu_settings`): each is checked against `rl plan`'s own
arithmetic for that GPU, never against a number written here."""

from __future__ import annotations

import os
from dataclasses import replace

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest

from rl.commands.plan import plan_profile, profile_tokens
from rl.deploy.flyte.config import EngineSpec, GrpoRunConfig, gpu_smoke, stress
from rl.errors import UnknownGpuError
from rl.gpu_settings import fits_with_margin
from rl.memory_plan import GPUS

PLANNED = ("L4", "A100", "A100_80G", "H100", "H200")


@pytest.mark.parametrize("gpu", PLANNED)
def test_the_stress_micro_batch_is_the_largest_power_of_two_the_gpus_plan_holds(gpu: str) -> None:
    """The micro-batch fits the trainer's plan on `gpu` with the estimator's margin; twice it would not, or would
    exceed a step's samples."""
    config = stress("s3://m", gpu=gpu)
    batch = config.trainer.micro_batch_size
    assert batch & (batch - 1) == 0
    assert fits_with_margin(plan_profile(config, gpu)[0])
    doubled = config.replace(trainer=replace(config.trainer, micro_batch_size=2 * batch))
    samples = config.grpo.prompts_per_iteration * config.grpo.group_size
    assert 2 * batch > samples or not fits_with_margin(plan_profile(doubled, gpu)[0])


def _group_tokens(config: GrpoRunConfig) -> int:
    prompt, completion = profile_tokens(config)
    return config.grpo.group_size * (prompt + completion)


PROFILES = [lambda g: stress("s3://m", gpu=g), lambda g: gpu_smoke(gpu=g)]


@pytest.mark.parametrize("gpu", PLANNED)
@pytest.mark.parametrize("profile", PROFILES, ids=["stress", "gpu-smoke"])
def test_vllms_batch_is_the_most_groups_whose_sequences_the_kv_cache_holds(profile: object, gpu: str) -> None:
    """One call's groups fit vLLM's KV cache at once with `max_num_seqs` their sequences; one group more would not
    (or the iteration has no more)."""
    config: GrpoRunConfig = profile(gpu)  # type: ignore[operator]
    engine, grpo = config.engine, config.grpo
    groups = engine.groups_per_call
    assert 1 <= groups <= grpo.prompts_per_iteration and engine.max_num_seqs == groups * grpo.group_size
    plan = plan_profile(config, gpu)[-1]
    assert plan.fits and plan.kv_tokens >= groups * _group_tokens(config), plan.lines()
    if groups < grpo.prompts_per_iteration:
        more = replace(engine, max_num_seqs=(groups + 1) * grpo.group_size)
        bigger = plan_profile(config.replace(engine=more), gpu)[-1]
        assert not (bigger.fits and bigger.kv_tokens >= (groups + 1) * _group_tokens(config))


def test_a_larger_gpu_never_gets_a_smaller_batch() -> None:
    """The plan's arithmetic is monotone in memory: a GPU with more of it gets at least the micro-batch and groups."""
    ordered = sorted(PLANNED, key=lambda g: GPUS[g].memory_mib)
    configs = [stress("s3://m", gpu=g) for g in ordered]
    batches = [c.trainer.micro_batch_size for c in configs]
    assert batches == sorted(batches)
    groups = [c.engine.groups_per_call for c in configs]
    assert groups == sorted(groups) and groups[0] < groups[-1]  # an L4 holds fewer groups than an H200


@pytest.mark.parametrize("name", ["B9000", "h100", "V100"])
def test_an_unknown_gpu_is_refused_naming_the_known_ones(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(UnknownGpuError, match=f"unknown GPU '{name}'") as refused:
        stress("s3://m", gpu=name)
    message = str(refused.value)
    assert "\n" not in message
    assert "Flyte spells it 'H100'" in message if name == "h100" else all(g in message for g in GPUS)
    monkeypatch.setenv("RL_FLYTE_GPU", name)  # the deployment's variable goes through the same check
    with pytest.raises(UnknownGpuError):
        gpu_smoke()


def test_the_deployments_gpu_sizes_the_profiles(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RL_FLYTE_GPU", "H200")
    assert stress("s3://m") == stress("s3://m", gpu="H200")
    monkeypatch.delenv("RL_FLYTE_GPU")
    assert stress("s3://m") == stress("s3://m", gpu="L4")  # the tiers' default GPU


def test_a_profile_no_gpu_holds_is_refused_in_one_line() -> None:
    from rl.errors import PlanDoesNotFitError

    with pytest.raises(PlanDoesNotFitError, match=r"^profile stress does not fit a T4: trainer needs") as refused:
        stress("s3://m", gpu="T4")
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize("reuse", ["0", "1"])
def test_production_and_the_bench_make_one_eager_or_graphs_choice(reuse: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """`rl bench --gpu` measures what production's rollout engine runs: the same `rl.gpu.vllm_enforce_eager`."""
    from rl.bench.gpu import GpuBenchConfig, bench_config

    monkeypatch.setenv("RL_FLYTE_REUSE", reuse)
    production = stress("s3://m").engine.vllm_kwargs(40960)
    assert production["enforce_eager"] == bench_config(GpuBenchConfig()).enforce_eager
    assert production["enforce_eager"] is (reuse == "0")  # warm replicas amortise graph capture; cold pods do not
    assert production["max_num_seqs"] == stress("s3://m").engine.max_num_seqs
    assert EngineSpec(kind="vllm", enforce_eager=True).vllm_kwargs(64)["enforce_eager"] is True  # an explicit choice


def test_the_torch_sampler_takes_one_group_per_call() -> None:
    from rl.errors import ConfigError

    with pytest.raises(ConfigError, match="groups_per_call=4 is vLLM's"):
        EngineSpec(kind="torch", groups_per_call=4)
