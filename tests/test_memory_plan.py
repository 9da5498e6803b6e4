"""`rl plan`'s estimator against allocations measured on the CPU, and the shipped profiles against their GPUs.

The measurement is torch's own: the profiler's allocator events (every tensor allocation and free, in bytes) over one
train step, whose running sum peaks at what the step added on top of the loaded model. The estimator is a formula over
the architecture (`rl.memory_plan`), never fitted to these numbers; it must land within 15% below and 25% above the
measured peak (docs/benchmarks.md has the ratios across dtypes, kernels, checkpointing and vocabularies), and the
weights exactly.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import replace
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from rl.cli import main
from rl.commands.plan import plan_profile
from rl.deploy.flyte.config import gpu_smoke, smoke, stress
from rl.memory_plan import GPUS, ModelArch, engine_plan, gpu, lora_parameters, trainer_plan, vllm_batch_defaults
from rl.models.opened_model import open_model
from rl.models.qwen3 import QWEN3_8B, Qwen3ModelConfig, build_qwen3_model, qwen3_config
from rl.storage.artifacts import LocalArtifacts
from rl.trainer.batched_loss import batched_backward
from rl.trainer.config import TrainerConfig
from rl.trainer.peft_trainer import PeftTrainer
from rl.trainer.step import clip_and_step, pinned_threads, prepare_step, run_step
from rl.types import Rollout, TrainBatch

LOW, HIGH = 0.85, 1.25


def _rollouts(prompt: int, completion: int, n: int) -> list[Rollout]:
    return [
        Rollout(
            group_id=j // 2,
            question="q",
            answer="a",
            completion="",
            prompt_token_ids=[2] + [5] * (prompt - 1),
            token_ids=[6 + (j + t) % 20 for t in range(completion)],
            logprobs=[-3.0] * completion,
            policy_version=0,
            seed=j,
        )
        for j in range(n)
    ]


def measured_step(model_dir: Path, config: TrainerConfig, prompt: int, completion: int, tmp: Path) -> tuple[int, int]:
    """(bytes of the loaded model's parameters, peak bytes a first train step allocates on top of them)."""
    trainer = PeftTrainer(open_model(model_dir, tokenizer=False), LocalArtifacts(tmp), config)
    init = asyncio.run(trainer.init_adapter(seed=1))
    files = asyncio.run(trainer.artifacts.get(init.adapter))
    rollouts = _rollouts(prompt, completion, 2 * config.micro_batch_size)
    rewards = [float(i % 2) for i in range(len(rollouts))]
    batch = TrainBatch(
        step=0, rollouts=rollouts, rewards=rewards, adapter=init.adapter, optimizer_state=None, new_version=1
    )
    with pinned_threads(1), torch.random.fork_rng(devices=[]):
        prepared = prepare_step(open_model(model_dir, tokenizer=False), batch, config, files, None)
        weights = sum(p.numel() * p.element_size() for p in prepared.model.parameters())
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            run_step(batch, prepared, config)
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events() if e.name() == "[memory]")
    live = peak = 0
    for _, nbytes in events:
        live += nbytes
        peak = max(peak, live)
    return weights, peak


def _check(model_dir: Path, config: TrainerConfig, prompt: int, completion: int, tmp: Path) -> None:
    weights, peak = measured_step(model_dir, config, prompt, completion, tmp)
    plan = trainer_plan(
        ModelArch.from_config_file(model_dir), config, prompt_tokens=prompt, completion_tokens=completion, budget=0
    )
    step = plan.terms["optimizer"] + plan.terms["activations"] + plan.terms["logits"]
    assert plan.terms["weights"] == weights
    assert LOW <= step / peak <= HIGH, (config, plan.terms, peak, step / peak)


QWEN3_SMALL_VOCAB = Qwen3ModelConfig(seed=1, vocab_size=64)
ATTENTION_ONLY = ("q_proj", "k_proj", "v_proj", "o_proj")


@pytest.mark.heavy
@pytest.mark.parametrize(
    "config",
    [
        TrainerConfig(lora_rank=8, micro_batch_size=4, target_modules=ATTENTION_ONLY),  # float32, eager, the demo's
        TrainerConfig(
            lora_rank=8, micro_batch_size=4, base_dtype="bfloat16", attention="sdpa", gradient_checkpointing=True
        ),
        TrainerConfig(lora_rank=8, micro_batch_size=4, base_dtype="bfloat16", attention="eager"),
    ],
    ids=["float32-eager", "bfloat16-sdpa-checkpointing", "bfloat16-eager"],
)
def test_the_estimate_of_activations_is_within_tolerance_of_the_measured_step(
    config: TrainerConfig, tmp_path: Path
) -> None:
    """Long sequences over a small vocabulary: activations dominate the step."""
    model_dir = build_qwen3_model(tmp_path / "model", QWEN3_SMALL_VOCAB, max_shard_size="100KB")
    _check(model_dir, config, 32, 96, tmp_path / "artifacts")


@pytest.mark.slow
@pytest.mark.parametrize("base_dtype", ["float32", "bfloat16"])
def test_the_estimate_of_logits_is_within_tolerance_over_the_real_vocabulary(base_dtype: str, tmp_path: Path) -> None:
    """Short sequences over Qwen3's 151,936 tokens: the logits dominate the step."""
    model_dir = build_qwen3_model(tmp_path / "model", Qwen3ModelConfig(seed=1))
    config = TrainerConfig(
        lora_rank=8, micro_batch_size=4, base_dtype=base_dtype, attention="sdpa", gradient_checkpointing=True
    )
    _check(model_dir, replace(config, target_modules=ATTENTION_ONLY), 8, 24, tmp_path / "artifacts")


def test_the_parameter_count_of_qwen3_8b_is_the_published_one() -> None:
    """8.19 B: the architecture numbers the plan uses for the stress profile are Qwen3-8B's."""
    assert ModelArch.from_hf_config(qwen3_config(QWEN3_8B).to_dict()).parameters() == 8_190_735_360


@pytest.mark.parametrize("gpu", ["L4", "H200"])
@pytest.mark.parametrize("profile", [lambda: stress("s3://m"), gpu_smoke], ids=["stress", "gpu-smoke"])
def test_the_shipped_gpu_profiles_fit_their_gpus_on_paper(profile: object, gpu: str) -> None:
    plans = plan_profile(profile(), gpu)  # type: ignore[operator]
    assert [p.task.split(" ")[0] for p in plans] == ["trainer", "engine"]
    assert all(p.fits for p in plans), [p.lines() for p in plans]


def test_the_stress_trainer_as_it_shipped_did_not_fit_even_an_h200() -> None:
    """float32 base, eager attention, no checkpointing, micro-batches of 64: the issue's out-of-memory, on paper."""
    config = stress("s3://m")
    shipped = replace(
        config.trainer, base_dtype="float32", attention="eager", gradient_checkpointing=False, micro_batch_size=64
    )
    trainer = plan_profile(config.replace(trainer=shipped), "H200")[0]
    assert not trainer.fits and trainer.terms["logits"] > 20 * 2**30


def test_rl_plan_prints_each_task_and_refuses_a_profile_that_does_not_fit(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RL_FLYTE_REUSE", "1")  # stderr holds the refusal alone (the warning has its own test)
    assert main(["plan", "--profile", "stress", "--gpu", "L4"]) == 0
    out = capsys.readouterr().out
    for term in ("trainer", "engine", "weights", "optimizer", "activations", "logits", "kv_cache"):
        assert term in out
    assert main(["plan", "--profile", "stress", "--gpu", "T4"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("rl plan: profile stress does not fit a T4") and "\n" not in err
    assert main(["plan", "--profile", "stress", "--gpu", "B9000"]) == 2


# ---------------------------------------------------------------------------------------------------------------------
# Each term against an independent calculation, by hand, for one small model

HAND_ARCH = ModelArch(hidden=8, layers=1, heads=2, kv_heads=1, head_dim=4, intermediate=16, vocab=10)
HAND_TRAINER = TrainerConfig(lora_rank=2, micro_batch_size=2, base_dtype="float32", attention="eager")


def test_each_trainer_term_equals_the_hand_calculation() -> None:
    """HAND_ARCH: h 8, one layer, q width 2 x 4 = 8, k/v width 4, MLP 16, vocabulary 10; LoRA rank 2 on every linear
    layer, float32 base (d = 4 bytes), eager attention, no checkpointing, micro-batches of 2 x (3 + 5) tokens."""
    plan = trainer_plan(HAND_ARCH, HAND_TRAINER, prompt_tokens=3, completion_tokens=5, budget=0)
    # Base: q 8x8 + k 8x4 + v 8x4 + o 8x8 + gate 8x16 + up 8x16 + down 16x8 = 64+32+32+64+128+128+128 = 576, plus two
    # RMSNorms (2 x 8) = 592 per layer; embeddings and head 2 x 10 x 8 = 160; final norm 8: 760 parameters.
    # LoRA: 2 x (in + out): q 2x16, k 2x12, v 2x12, o 2x16, gate 2x24, up 2x24, down 2x24 = 32+24+24+32+48+48+48 = 256.
    assert (HAND_ARCH.parameters(), lora_parameters(HAND_ARCH, 2, "all-linear")) == (760, 256)
    # weights: 760 x 4 (float32 base) + 256 x 4 (float32 LoRA) = 3040 + 1024.
    assert plan.terms["weights"] == 4064
    # optimizer: per LoRA parameter its gradient (4) and AdamW's exp_avg (4) and exp_avg_sq (4): 256 x 12.
    assert plan.terms["optimizer"] == 3072
    # activations per token of the layer (bytes): norm inputs 2x4x8 = 64; normed outputs feeding LoRA (qkv, gate/up)
    # 2x4x8 = 64; o_proj's input 4x8 = 32 and down_proj's 4x16 = 64; q, k, v, out 4x(2x8 + 2x4) = 96; eager softmax
    # and probabilities 2 heads x 8 positions x (4 + 4) = 128; gate, up, silu 3x4x16 = 192: 640. Tokens 2 x 8 = 16:
    # 16 x 640 = 10240, plus the final norm's float32 input 16 x 4 x 8 = 512.
    assert plan.terms["activations"] == 10752
    # logits: kept [2, 8, 10] x 4 = 640; over the 2 x 5 = 10 completion positions the forward's picked logits and
    # log-softmax (10 x 10 x 4) x 2 = 800, the backward's three float32 [10, 10] = 1200: 640 + max(800, 1200).
    assert plan.terms["logits"] == 1840


def test_a_step_of_fewer_samples_than_a_micro_batch_is_planned_at_its_samples() -> None:
    """HAND_TRAINER's micro-batches hold 2; a step of 1 sample fills half of one. Activations per token are as above
    (640 + the final norm's 32 bytes) over 1 x 8 tokens: 8 x 672 = 5376. Logits: kept [1, 8, 10] x 4 = 320, over
    5 completion positions the forward's 2 x (5 x 10 x 4) = 400 and the backward's 3 x 200 = 600: 320 + 600 = 920.
    A step of 5 samples still runs micro-batches of 2 (the hand calculation above)."""
    one = trainer_plan(HAND_ARCH, HAND_TRAINER, prompt_tokens=3, completion_tokens=5, budget=0, samples=1)
    assert (one.terms["activations"], one.terms["logits"]) == (5376, 920)
    assert (one.terms["weights"], one.terms["optimizer"]) == (4064, 3072)  # the model's, whatever the batch
    five = trainer_plan(HAND_ARCH, HAND_TRAINER, prompt_tokens=3, completion_tokens=5, budget=0, samples=5)
    assert (five.terms["activations"], five.terms["logits"]) == (10752, 1840)


def test_rl_plan_caps_the_micro_batch_at_a_steps_samples() -> None:
    """smoke trains 4 prompts x 8 samples a step with TrainerConfig's micro-batches of 64: one micro-batch of 32 (the
    plan before counted 64, twice the activations and logits; docs/benchmarks.md measured SmolLM2's step)."""
    config = smoke()
    assert config.trainer.micro_batch_size == 64
    trainer = plan_profile(config, "L4")[0]
    assert "micro-batches of 32 x" in " ".join(trainer.notes), trainer.notes


@pytest.mark.parametrize(
    ("gpu_name", "expected"),
    [
        # vLLM 0.33's EngineArgs.get_batch_defaults for the LLM class: 256 sequences and 8192 batched tokens below
        # 70 GiB or on an A100; 1024 and 16384 from 70 GiB (H100, H200). Forward peak per batched token (bf16, 2 bytes):
        # 2 x (4 x 16 + 2 x 8 + 8 + 2 x 4) = 2 x 96 = 192; the sampler's two float32 [seqs, 10] tensors: 8 x 10 x seqs.
        ("L4", 8192 * 192 + 80 * 256),  # 1,593,344
        ("A100_80G", 8192 * 192 + 80 * 256),  # 80 GiB, but vLLM keeps an A100 on the small defaults
        ("H100", 16384 * 192 + 80 * 1024),  # 3,227,648
        ("H200", 16384 * 192 + 80 * 1024),
    ],
)
def test_the_engines_activation_peak_takes_vllms_batch_defaults_for_the_gpu(gpu_name: str, expected: int) -> None:
    from types import SimpleNamespace

    engine = SimpleNamespace(gpu_memory_utilization=0.9, max_model_len=8, max_lora_rank=8)
    plan = engine_plan(HAND_ARCH, engine, group_tokens=8, device=gpu(gpu_name))
    assert plan.terms["activations"] == expected
    assert f"{vllm_batch_defaults(gpu(gpu_name))[0]} sequences" in " ".join(plan.notes)


def test_gpu_names_are_flytes_exactly_and_any_other_spelling_is_refused_naming_flytes() -> None:
    """One `RL_FLYTE_GPU` feeds `flyte.GPU` and `rl plan`: every name the plan knows is one Flyte accepts."""
    import flyte

    from rl.errors import InputError

    for name in GPUS:
        flyte.GPU(name, 1)  # type: ignore[arg-type]  # raises ValueError on a name Flyte's GPUType lacks
    for wrong, right in (("A100-80G", "A100_80G"), ("l4", "L4"), ("L40S", "L40s")):
        with pytest.raises(InputError, match=f"Flyte spells it '{right}'"):
            gpu(wrong)


def _tiny_step_allocations(tmp_path: Path, config: TrainerConfig) -> tuple[ModelArch, dict[str, int]]:
    """One step of the tiny model on the CPU: bytes of the LoRA weights, their gradients, and AdamW's state."""
    from rl.models.tiny import TinyModelConfig, build_tiny_model

    model_dir = build_tiny_model(tmp_path / "model", TinyModelConfig(hidden_size=32, layers=2, heads=2, kv_heads=1))
    trainer = PeftTrainer(open_model(model_dir, tokenizer=False), LocalArtifacts(tmp_path / "store"), config)
    init = asyncio.run(trainer.init_adapter(seed=1))
    rollouts = _rollouts(3, 4, 4)
    batch = TrainBatch(
        step=0, rollouts=rollouts, rewards=[0.0, 1.0, 0.0, 1.0], adapter=init.adapter, optimizer_state=None,
        new_version=1,
    )  # fmt: skip
    files = asyncio.run(trainer.artifacts.get(init.adapter))
    with pinned_threads(1):
        prepared = prepare_step(open_model(model_dir, tokenizer=False), batch, config, files, None)
        batched_backward(
            prepared.model, batch, prepared.advantages, config, indices=prepared.contributing, loss_scale=0.25
        )
        grads = sum(p.grad.nbytes for _, p in prepared.params if p.grad is not None)
        clip_and_step(prepared, config)
    moments = sum(
        value.nbytes
        for state in prepared.optimizer.state.values()
        for key, value in state.items()
        if key in ("exp_avg", "exp_avg_sq")
    )
    measured = {
        "lora": sum(p.nbytes for _, p in prepared.params),
        "base": sum(p.nbytes for p in prepared.model.parameters() if not p.requires_grad),
        "grads": grads,
        "moments": moments,
    }
    return ModelArch.from_config_file(model_dir), measured


@pytest.mark.parametrize("base_dtype", ["float32", "bfloat16"])
def test_the_weights_and_optimizer_terms_equal_the_allocations_of_a_cpu_step(base_dtype: str, tmp_path: Path) -> None:
    """What the CPU measures exactly: the base and LoRA weights, every LoRA gradient, and AdamW's exp_avg and
    exp_avg_sq after a step (the optimizer term is gradients + both moments, 12 bytes per LoRA parameter)."""
    config = TrainerConfig(lora_rank=4, micro_batch_size=2, base_dtype=base_dtype)
    arch, measured = _tiny_step_allocations(tmp_path, config)
    plan = trainer_plan(arch, config, prompt_tokens=3, completion_tokens=4, budget=0)
    n_lora = lora_parameters(arch, 4, "all-linear")
    assert measured["lora"] == n_lora * 4  # float32 LoRA whatever the base's dtype
    assert measured["grads"] == measured["lora"] and measured["moments"] == 2 * measured["lora"]
    assert plan.terms["weights"] == measured["base"] + measured["lora"]
    assert plan.terms["optimizer"] == measured["grads"] + measured["moments"]


def test_rl_plan_warns_about_the_cost_of_running_without_reuse(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without RL_FLYTE_REUSE=1 every rollout call is a fresh pod that downloads the 16 GB base and cold-starts vLLM
    for one group; the torch sampler (smoke) has nothing to warn about."""
    monkeypatch.delenv("RL_FLYTE_REUSE", raising=False)
    assert main(["plan", "--profile", "stress", "--gpu", "H200"]) == 0
    err = capsys.readouterr().err
    per_call = stress("s3://m", gpu="H200").engine.groups_per_call  # the driver's calls: 32 groups, that many each
    calls = -(-32 // per_call)
    assert "RL_FLYTE_REUSE is not 1" in err and "16.4 GB" in err and f"{calls} pods per iteration" in err, err
    monkeypatch.setenv("RL_FLYTE_REUSE", "1")
    assert main(["plan", "--profile", "stress", "--gpu", "H200"]) == 0
    assert "RL_FLYTE_REUSE" not in capsys.readouterr().err
    monkeypatch.delenv("RL_FLYTE_REUSE")
    assert main(["plan", "--profile", "smoke", "--gpu", "L4"]) == 0
    assert "RL_FLYTE_REUSE" not in capsys.readouterr().err


def test_the_stress_tier_warns_about_the_cost_of_running_without_reuse(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`python -m rl.deploy.flyte.grpo --profile stress` on a cluster (flyte.run faked: nothing is submitted)."""
    from types import SimpleNamespace

    import flyte

    import rl.deploy.flyte.grpo as grpo

    submitted: list[object] = []
    monkeypatch.setattr(flyte, "init_from_config", lambda *a, **k: None)
    monkeypatch.setattr(flyte, "run", lambda task, config: submitted.append(config) or SimpleNamespace(url="u"))
    for reuse, warned in ((False, True), (True, False)):
        monkeypatch.setattr(grpo, "REUSE", reuse)
        assert grpo.main(["--profile", "stress", "--base-uri", "s3://m"]) == 0
        assert ("RL_FLYTE_REUSE is not 1" in capsys.readouterr().err) is warned
    assert len(submitted) == 2
