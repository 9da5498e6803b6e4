"""The PEFT LoRA trainer on the tiny model: deterministic init, pure replayable steps, skipped no-signal samples,
staleness bounds, and optimizer state that survives the artifact round trip bit for bit."""

from __future__ import annotations

import asyncio
import dataclasses
import io
import itertools
import json
import pickle
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest
import torch
from fixtures_real import tiny_model_dir
from loss_reference import reference_step
from trainer_batches import make_batch, make_rollouts, varied_rewards

from rl.errors import BatchError, OptimizerStateError, StaleBatchError
from rl.models.opened_model import open_model
from rl.storage.artifacts import LocalArtifacts
from rl.trainer.adapter import load_policy, trainable_parameters
from rl.trainer.config import TrainerConfig
from rl.trainer.optimizer_state import OPTIMIZER_FILE, build_optimizer, optimizer_files, read_optimizer_state
from rl.trainer.peft_trainer import PeftTrainer
from rl.types import StepMetrics, TrainResult

__all__ = ["tiny_model_dir"]

T = TypeVar("T")
CONFIG = TrainerConfig(lora_rank=4, lora_alpha=8, seed=3, threads=1)


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


@pytest.fixture
def trainer(tiny_model_dir: Path, tmp_path: Path) -> PeftTrainer:
    return PeftTrainer(open_model(tiny_model_dir), LocalArtifacts(tmp_path / "artifacts"), CONFIG)


@pytest.fixture(scope="module")
def rollouts(tiny_model_dir: Path) -> list:
    return make_rollouts(tiny_model_dir, groups=3, samples=4, seed=11)


def _files(trainer: PeftTrainer, result: TrainResult) -> tuple[dict[str, bytes], dict[str, bytes]]:
    return run(trainer.artifacts.get(result.adapter)), run(trainer.artifacts.get(result.optimizer_state))


def test_init_adapter_is_a_function_of_the_seed(trainer: PeftTrainer, tmp_path: Path) -> None:
    """Same seed, same bytes (also from a second store); another seed, other LoRA weights."""
    first = run(trainer.init_adapter(seed=5))
    other_store = PeftTrainer(trainer.base_dir, LocalArtifacts(tmp_path / "other"), CONFIG)
    again = run(other_store.init_adapter(seed=5))
    different = run(trainer.init_adapter(seed=6))
    assert first.policy_version == 0 and first.metrics.contributing == 0
    assert first.adapter.digest == again.adapter.digest
    assert first.optimizer_state.digest == again.optimizer_state.digest
    assert different.adapter.digest != first.adapter.digest


def test_init_optimizer_state_is_empty(trainer: PeftTrainer) -> None:
    """Version 0's optimizer state has no moments yet: the first step starts AdamW from scratch."""
    init = run(trainer.init_adapter(seed=5))
    _, opt = _files(trainer, init)
    saved = read_optimizer_state(opt)
    assert saved["state_dict"]["state"] == {}
    assert len(saved["param_names"]) > 0


@pytest.mark.heavy
def test_a_step_changes_the_adapter_and_reports_on_policy_metrics(trainer: PeftTrainer, rollouts: list) -> None:
    """One step moves the adapter; on-policy samples have ratio 1, so nothing is clipped and the loss starts at 0."""
    init = run(trainer.init_adapter(seed=5))
    batch = make_batch(rollouts, varied_rewards(rollouts), init.adapter, init.optimizer_state)
    result = run(trainer.train_step(batch))
    assert result.policy_version == 1
    assert result.adapter.digest != init.adapter.digest
    assert result.optimizer_state.digest != init.optimizer_state.digest
    m = result.metrics
    assert (m.contributing, m.skipped_zero_advantage, m.max_staleness) == (12, 0, 0)
    assert m.clip_frac == 0.0
    # At ratio 1 the surrogate's value is -mean(A) = 0 over normalised groups, and the KL to the base is 0.
    assert abs(m.loss) < 1e-5 and abs(m.kl) < 1e-6
    assert m.grad_norm > 0.0


def test_a_replayed_step_is_bitwise_identical(trainer: PeftTrainer, rollouts: list, tmp_path: Path) -> None:
    """Replaying a batch (another trainer object, another store, another ambient thread count) gives the same bytes."""
    init = run(trainer.init_adapter(seed=5))
    batch = make_batch(rollouts, varied_rewards(rollouts), init.adapter, init.optimizer_state)
    first = run(trainer.train_step(batch))
    second_batch = make_batch(rollouts, varied_rewards(rollouts), first.adapter, first.optimizer_state, new_version=2)
    second = run(trainer.train_step(second_batch))

    replay_store = LocalArtifacts(tmp_path / "replay")
    replayer = PeftTrainer(trainer.base_dir, replay_store, CONFIG)
    run(replay_store.put(run(trainer.artifacts.get(first.adapter)), name="a"))
    run(replay_store.put(run(trainer.artifacts.get(first.optimizer_state)), name="o"))
    ambient = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        replayed = run(replayer.train_step(second_batch))
    finally:
        torch.set_num_threads(ambient)
    assert replayed.adapter.digest == second.adapter.digest
    assert replayed.optimizer_state.digest == second.optimizer_state.digest
    assert replayed.metrics == second.metrics


@pytest.mark.heavy
def test_zero_advantage_groups_are_skipped_entirely(trainer: PeftTrainer, rollouts: list) -> None:
    """A no-signal group is counted and contributes nothing, KL included: appending one leaves the update unchanged."""
    init = run(trainer.init_adapter(seed=5))
    with_signal = rollouts[:8]  # groups 0 and 1
    silent = [dataclasses.replace(r, group_id=9) for r in rollouts[8:]]
    plain = run(trainer.train_step(make_batch(with_signal, varied_rewards(with_signal), init.adapter, None)))
    padded_rollouts = with_signal + silent
    padded_batch = make_batch(padded_rollouts, varied_rewards(padded_rollouts, silent_groups=[9]), init.adapter, None)
    padded = run(trainer.train_step(padded_batch))
    assert (padded.metrics.contributing, padded.metrics.skipped_zero_advantage) == (8, 4)
    assert padded.adapter.digest == plain.adapter.digest
    assert padded.optimizer_state.digest == plain.optimizer_state.digest


def test_a_batch_without_signal_takes_no_step(trainer: PeftTrainer, rollouts: list) -> None:
    """All groups silent: no optimizer step at all (the KL term of skipped samples is skipped too), so the new version's
    adapter and optimizer state are byte-identical to the old ones, even after a real step gave AdamW momentum."""
    init = run(trainer.init_adapter(seed=5))
    moved = run(trainer.train_step(make_batch(rollouts, varied_rewards(rollouts), init.adapter, init.optimizer_state)))
    silent = varied_rewards(rollouts, silent_groups=[0, 1, 2])
    result = run(trainer.train_step(make_batch(rollouts, silent, moved.adapter, moved.optimizer_state, new_version=2)))
    assert (result.metrics.contributing, result.metrics.skipped_zero_advantage) == (0, 12)
    assert result.metrics.loss == 0.0 and result.metrics.grad_norm == 0.0
    assert result.policy_version == 2
    assert _files(trainer, result) == _files(trainer, moved)


@pytest.mark.heavy
def test_the_loss_falls_on_a_fixed_batch(trainer: PeftTrainer, rollouts: list) -> None:
    """Training repeatedly on one batch (fixed sampling log-probs) lowers the loss each step.

    At a small learning rate: once every ratio has left the clip range [0.8, 1.2] on its advantage's side the surrogate
    is flat and only the KL term pulls back, so at lr 1e-2 the loss plateaus after about three steps (PPO's design).
    """
    config = dataclasses.replace(CONFIG, max_staleness=10, lr=3e-3)
    trainer = PeftTrainer(trainer.base_dir, trainer.artifacts, config)
    state = run(trainer.init_adapter(seed=5))
    rewards = varied_rewards(rollouts)
    losses = []
    for version in range(1, 6):
        batch = make_batch(rollouts, rewards, state.adapter, state.optimizer_state, step=version, new_version=version)
        state = run(trainer.train_step(batch))
        losses.append(state.metrics.loss)  # the loss of the adapter the step started from
    assert all(later < earlier for earlier, later in itertools.pairwise(losses)), losses
    assert state.metrics.max_staleness == 4


def test_stale_rollouts_beyond_the_bound_raise(trainer: PeftTrainer, rollouts: list) -> None:
    """Staleness = (new_version - 1) - policy_version: at max_staleness a step trains; one more raises, naming it."""
    init = run(trainer.init_adapter(seed=5))
    mixed = [*rollouts[:5], dataclasses.replace(rollouts[5], policy_version=-1), *rollouts[6:]]
    at_bound = run(
        trainer.train_step(make_batch(rollouts, varied_rewards(rollouts), init.adapter, None, new_version=2))
    )
    assert at_bound.metrics.max_staleness == 1
    with pytest.raises(StaleBatchError, match="rollout 5 was sampled from policy version -1") as info:
        run(trainer.train_step(make_batch(mixed, varied_rewards(mixed), init.adapter, None, new_version=2)))
    assert (info.value.index, info.value.staleness, info.value.max_staleness) == (5, 2, 1)
    assert pickle.loads(pickle.dumps(info.value)).index == 5  # crosses process boundaries intact
    future = [dataclasses.replace(r, policy_version=1) for r in rollouts]
    with pytest.raises(StaleBatchError, match="rollout 0 claims policy version 1, newer than the version being"):
        run(trainer.train_step(make_batch(future, varied_rewards(future), init.adapter, None, new_version=1)))


def test_malformed_batches_raise_batch_errors(trainer: PeftTrainer, rollouts: list) -> None:
    init = run(trainer.init_adapter(seed=5))
    with pytest.raises(BatchError, match="12 rollouts but 11 rewards"):
        run(trainer.train_step(make_batch(rollouts, varied_rewards(rollouts)[:-1], init.adapter, None)))
    short = [dataclasses.replace(rollouts[0], logprobs=rollouts[0].logprobs[:-1]), *rollouts[1:]]
    with pytest.raises(BatchError, match=r"rollout 0 .* sampling log-probs"):
        run(trainer.train_step(make_batch(short, varied_rewards(short), init.adapter, None)))


def test_optimizer_state_round_trips_exactly_through_the_artifact(trainer: PeftTrainer, rollouts: list) -> None:
    """Loading a stored optimizer state and saving it again gives the same bytes and bitwise-equal moment tensors."""
    init = run(trainer.init_adapter(seed=5))
    result = run(trainer.train_step(make_batch(rollouts, varied_rewards(rollouts), init.adapter, init.optimizer_state)))
    adapter, opt = _files(trainer, result)
    model = load_policy(trainer.base_dir, adapter, trainable=True)
    params = trainable_parameters(model)
    optimizer = build_optimizer(params, CONFIG, opt)
    assert optimizer_files(optimizer, [n for n, _ in params]) == opt
    state = optimizer.state_dict()["state"]
    assert len(state) == len(params) and all(float(s["step"]) == 1.0 for s in state.values())


@pytest.mark.heavy
def test_an_optimizer_state_from_another_adapter_layout_is_refused(trainer: PeftTrainer, rollouts: list) -> None:
    init = run(trainer.init_adapter(seed=5))
    narrow = PeftTrainer(trainer.base_dir, trainer.artifacts, dataclasses.replace(CONFIG, target_modules=("q_proj",)))
    narrow_init = run(narrow.init_adapter(seed=5))
    batch = make_batch(rollouts, varied_rewards(rollouts), init.adapter, narrow_init.optimizer_state)
    with pytest.raises(OptimizerStateError, match="same TrainResult"):
        run(trainer.train_step(batch))


LINEAR_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def test_the_adapter_config_is_written_canonically(trainer: PeftTrainer) -> None:
    """Bytes that depend on neither the hash seed (PEFT writes target_modules in set order) nor the base's location,
    so a step replayed in another process or on another machine gives the same digest."""
    files, _ = _files(trainer, run(trainer.init_adapter(seed=5)))
    config = json.loads(files["adapter_config.json"])
    targets = config["target_modules"]
    assert targets == sorted(targets)
    # peft 0.13 (our lowest bound) writes the 7 module names "all-linear" resolves to; later versions each layer's 7
    # module paths (14 for the 2-layer model). Either way every entry names one of the model's linear projections.
    assert len(targets) in (7, 14) and {t.rsplit(".", 1)[-1] for t in targets} == set(LINEAR_PROJECTIONS)
    assert config["base_model_name_or_path"] is None
    assert str(trainer.base_dir) not in files["adapter_config.json"].decode()


@pytest.mark.heavy
def test_a_warm_trainer_writes_the_bytes_a_cold_one_writes(
    tiny_model_dir: Path, rollouts: list, tmp_path: Path
) -> None:
    """A trainer continuing from the model and optimizer it kept in memory writes, step after step, exactly the bytes a
    fresh trainer writes from the artifacts alone (the warm path is a cache, not another computation)."""
    config = dataclasses.replace(CONFIG, max_staleness=3)  # the fixed rollouts come from version 0
    trainer = PeftTrainer(open_model(tiny_model_dir), LocalArtifacts(tmp_path / "artifacts"), config)
    init = run(trainer.init_adapter(seed=5))
    results = [init]
    for version in (1, 2, 3):
        rewards = varied_rewards(rollouts, silent_groups=[version % 3])
        batch = make_batch(rollouts, rewards, results[-1].adapter, results[-1].optimizer_state, new_version=version)
        results.append(run(trainer.train_step(batch)))
    assert trainer.cold_loads == 1, "steps 2 and 3 named the artifacts step 1 and 2 wrote: they must run warm"
    for version in (1, 2, 3):
        cold = PeftTrainer(trainer.base_dir, trainer.artifacts, config)
        rewards = varied_rewards(rollouts, silent_groups=[version % 3])
        prev = results[version - 1]
        replayed = run(
            cold.train_step(make_batch(rollouts, rewards, prev.adapter, prev.optimizer_state, new_version=version))
        )
        assert cold.cold_loads == 1
        assert replayed.adapter.digest == results[version].adapter.digest, version
        assert replayed.optimizer_state.digest == results[version].optimizer_state.digest, version
        assert replayed.metrics == results[version].metrics


def test_a_batch_naming_other_artifacts_or_following_a_failure_loads_cold(trainer: PeftTrainer, rollouts: list) -> None:
    """Only a batch naming exactly the adapter and optimizer state the last step wrote runs warm: an older adapter, and
    any step after one that raised, load from the artifacts."""
    init = run(trainer.init_adapter(seed=5))
    first = run(trainer.train_step(make_batch(rollouts, varied_rewards(rollouts), init.adapter, init.optimizer_state)))
    again = run(trainer.train_step(make_batch(rollouts, varied_rewards(rollouts), init.adapter, init.optimizer_state)))
    assert trainer.cold_loads == 2 and again.adapter.digest == first.adapter.digest
    stale = make_batch(rollouts, varied_rewards(rollouts), first.adapter, first.optimizer_state, new_version=5)
    with pytest.raises(StaleBatchError):
        run(trainer.train_step(stale))
    run(
        trainer.train_step(
            make_batch(rollouts, varied_rewards(rollouts), first.adapter, first.optimizer_state, new_version=2)
        )
    )
    assert trainer.cold_loads == 3


@pytest.mark.heavy
@pytest.mark.parametrize("micro_batch_size", [1, 5])
def test_batched_and_per_sample_losses_agree(
    tiny_model_dir: Path, rollouts: list, tmp_path: Path, micro_batch_size: int
) -> None:
    """The trainer's batched loss (any micro-batch size) and the per-sample reference (`loss_reference`) take the same
    step up to float rounding: the same metrics and adapter weights within 1e-5; the trainer replays bitwise (the
    replay test)."""
    config = dataclasses.replace(CONFIG, micro_batch_size=micro_batch_size)
    per_sample, batched, metrics = _reference_and_trainer_steps(tiny_model_dir, rollouts, tmp_path, config)
    assert per_sample.keys() == batched.keys()
    for name in per_sample:
        assert torch.allclose(per_sample[name], batched[name], atol=1e-5, rtol=1e-4), name
    assert metrics[0].contributing == metrics[1].contributing == 12
    assert metrics[1].grad_norm == pytest.approx(metrics[0].grad_norm, rel=1e-4)
    assert metrics[1].kl == pytest.approx(metrics[0].kl, abs=1e-7)


def _reference_and_trainer_steps(
    base_dir: Path, rollouts: list, tmp_path: Path, config: TrainerConfig
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], list[StepMetrics]]:
    """One step from the same adapter on the per-sample reference and on the trainer: both adapters' weights, and the
    metrics (reference first)."""
    from safetensors.torch import load as load_safetensors

    t = PeftTrainer(open_model(base_dir, tokenizer=False), LocalArtifacts(tmp_path / "a"), config)
    init = run(t.init_adapter(seed=5))
    batch = make_batch(rollouts, varied_rewards(rollouts), init.adapter, init.optimizer_state)
    adapter, opt = _files(t, init)
    reference, want = reference_step(base_dir, batch, config, adapter, opt)
    result = run(t.train_step(batch))
    got = run(t.artifacts.get(result.adapter))["adapter_model.safetensors"]
    return (
        load_safetensors(reference["adapter_model.safetensors"]),
        load_safetensors(got),
        [want, result.metrics],
    )


def test_adapter_weights_are_the_bytes_peft_save_pretrained_writes(trainer: PeftTrainer, rollouts: list) -> None:
    """The in-memory serialisation writes exactly what PEFT's `save_pretrained` writes, so vLLM and PEFT load it."""
    import tempfile

    init = run(trainer.init_adapter(seed=5))
    result = run(trainer.train_step(make_batch(rollouts, varied_rewards(rollouts), init.adapter, None)))
    files = run(trainer.artifacts.get(result.adapter))
    model = load_policy(trainer.base_dir, files, trainable=False)
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        assert (Path(tmp) / "adapter_model.safetensors").read_bytes() == files["adapter_model.safetensors"]


def test_an_optimizer_state_in_the_older_torch_save_format_still_resumes(trainer: PeftTrainer, rollouts: list) -> None:
    """Format 1 (`optimizer.pt`, torch.save) artifacts from earlier runs load to the same moments, and the next save
    writes format 2 with equal bytes to a format-2 round trip."""
    init = run(trainer.init_adapter(seed=5))
    result = run(trainer.train_step(make_batch(rollouts, varied_rewards(rollouts), init.adapter, init.optimizer_state)))
    adapter, opt = _files(trainer, result)
    saved = read_optimizer_state(opt)
    legacy = io.BytesIO()
    torch.save({"format": 1, "param_names": saved["param_names"], "state_dict": saved["state_dict"]}, legacy)
    model = load_policy(trainer.base_dir, adapter, trainable=True)
    params = trainable_parameters(model)
    from_legacy = build_optimizer(params, CONFIG, {"optimizer.pt": legacy.getvalue()})
    assert optimizer_files(from_legacy, [n for n, _ in params]) == opt
    with pytest.raises(OptimizerStateError, match="unreadable"):
        build_optimizer(params, CONFIG, {OPTIMIZER_FILE: b"not safetensors"})
    with pytest.raises(OptimizerStateError, match=r"lacks optimizer\.safetensors"):
        build_optimizer(params, CONFIG, {"other.bin": b""})


def test_adapters_off_is_peft_disable_adapter_bit_for_bit(trainer: PeftTrainer, rollouts: list) -> None:
    """The trainer's reference forward (`adapters_off`) computes what PEFT's `disable_adapter()` computes, and leaves
    the adapter on and trainable afterwards."""
    from rl.trainer.batched_loss import adapters_off

    init = run(trainer.init_adapter(seed=5))
    moved = run(trainer.train_step(make_batch(rollouts, varied_rewards(rollouts), init.adapter, None)))
    model = load_policy(trainer.base_dir, run(trainer.artifacts.get(moved.adapter)), trainable=True)
    ids = torch.tensor([rollouts[0].prompt_token_ids + rollouts[0].token_ids])
    with torch.no_grad():
        adapted = model(input_ids=ids).logits
        with model.disable_adapter():
            want = model(input_ids=ids).logits
        with adapters_off(model):
            got = model(input_ids=ids).logits
        after = model(input_ids=ids).logits
    assert torch.equal(got, want) and not torch.equal(got, adapted)
    assert torch.equal(after, adapted)
    assert all(p.requires_grad for _, p in trainable_parameters(model)) and trainable_parameters(model)


@pytest.mark.heavy
def test_dropout_masks_agree_with_the_per_sample_reference_at_micro_batch_one(
    tiny_model_dir: Path, rollouts: list, tmp_path: Path
) -> None:
    """With LoRA dropout on, the per-sample reference and the trainer at a micro-batch size of 1 seed each forward's
    masks by one rule (`rl.seeding.dropout_seed`), so they take the same step up to float rounding."""
    dropout = dataclasses.replace(CONFIG, lora_dropout=0.5, micro_batch_size=1)
    per_sample, batched, _ = _reference_and_trainer_steps(tiny_model_dir, rollouts, tmp_path, dropout)
    assert per_sample.keys() == batched.keys()
    for name in per_sample:
        assert torch.allclose(per_sample[name], batched[name], atol=1e-5, rtol=1e-4), name


def test_the_step_scales_its_advantages_as_configured(tiny_model_dir: Path, rollouts: list, tmp_path: Path) -> None:
    """`TrainerConfig.advantage_scale` reaches the step: with every group's rewards {0, 1, 0, 1} (population std 0.5),
    "population_std" divides each centred reward by 0.5 + eps and "none" leaves it, so on the first, on-policy step (KL
    0) the pre-clip gradient of "none" is (0.5 + eps) times that of "population_std"."""
    group = rollouts[:4]  # one group: the law needs no more, and the test stays fast
    rewards = [float(i % 2) for i in range(len(group))]
    norms = {}
    for scale in ("population_std", "none"):
        config = dataclasses.replace(CONFIG, advantage_scale=scale)
        trainer = PeftTrainer(open_model(tiny_model_dir), LocalArtifacts(tmp_path / scale), config)
        init = run(trainer.init_adapter(seed=5))
        norms[scale] = run(trainer.train_step(make_batch(group, rewards, init.adapter, init.optimizer_state)))
    scaled, unscaled = norms["population_std"].metrics.grad_norm, norms["none"].metrics.grad_norm
    assert scaled > 0 and unscaled == pytest.approx(scaled * (0.5 + CONFIG.std_eps), rel=1e-4)
