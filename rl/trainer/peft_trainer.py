"""The PEFT LoRA trainer: one GRPO step as a pure function of (base model, adapter, optimizer state, batch).

Everything a step needs comes in as artifacts and everything it produces goes out as artifacts (the seed's "pass weights
and optimizer state in and out of the train task as flyte.io.Dir"), so a retried or replayed step recomputes the same
bytes: the thread count is pinned, every random draw is seeded from (config seed, step, sample), and the adapter config
is written canonically (PEFT lists `target_modules` in set order, which changes with the interpreter's hash seed).

The per-sample loss closures (`sample_loss_fns`) are the one implementation of the objective; the single-process step
here and the multi-rank step in `rl.trainer.ddp` both call them, differing only in which samples and what scale.

Zero-advantage samples (all of a group that scored the same, or a sample scoring exactly its group's mean) are skipped
entirely — surrogate *and* KL term — as the seed says ("a group where every completion scored the same gives no signal
and is skipped"). So a batch in which no sample carries signal takes no optimizer step: the new version's adapter and
optimizer state are byte-identical to the old ones.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import contextlib
import hashlib
import io
import json
import math
import tempfile
import warnings
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from peft import LoraConfig, PeftModel, get_peft_model, get_peft_model_state_dict
from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors

from rl.advantages import group_normalized_advantages
from rl.engines.decoding import teacher_forced_logprobs
from rl.errors import TrainerError
from rl.loss import grpo_sample_loss
from rl.models import load_base_model
from rl.protocols import Artifacts
from rl.trainer.batched_loss import batched_backward
from rl.trainer.config import TrainerConfig
from rl.types import StepMetrics, TrainBatch, TrainResult

__all__ = [
    "ADAPTER_FILES",
    "LEGACY_OPTIMIZER_FILE",
    "OPTIMIZER_FILE",
    "AdapterArtifactError",
    "BatchError",
    "OptimizerStateError",
    "PeftTrainer",
    "PreparedStep",
    "RolloutVersionError",
    "StaleRolloutError",
    "adapter_files",
    "build_optimizer",
    "check_batch",
    "clip_and_step",
    "load_policy",
    "new_adapter",
    "optimizer_files",
    "pinned_threads",
    "prepare_step",
    "prepare_warm_step",
    "read_optimizer_state",
    "run_step",
    "sample_loss_fns",
    "stat_sums",
    "step_metrics",
    "trainable_parameters",
]

ADAPTER_FILES: tuple[str, ...] = ("adapter_config.json", "adapter_model.safetensors")
OPTIMIZER_FILE = "optimizer.safetensors"
LEGACY_OPTIMIZER_FILE = "optimizer.pt"  # format 1 (torch.save), written before format 2; still read
_OPTIMIZER_FORMAT = 2


class BatchError(TrainerError):
    """A TrainBatch is malformed (lengths disagree, an empty completion, a version below 1)."""


class RolloutVersionError(BatchError):
    """A rollout's `policy_version` is impossible or too old for the version being trained."""


class StaleRolloutError(RolloutVersionError):
    """A rollout was sampled more than `max_staleness` versions before the adapter being trained."""

    def __init__(self, index: int, rollout_version: int, trained_version: int, max_staleness: int) -> None:
        self.index = index
        self.rollout_version = rollout_version
        self.trained_version = trained_version
        self.staleness = trained_version - rollout_version
        self.max_staleness = max_staleness
        super().__init__(
            f"rollout {index} was sampled from policy version {rollout_version} but this step trains version "
            f"{trained_version} (staleness {self.staleness} > max_staleness {max_staleness}); regenerate it from a "
            f"newer adapter or raise TrainerConfig.max_staleness"
        )

    def __reduce__(self) -> tuple[type, tuple[int, int, int, int]]:
        # Rebuilt from its fields, so it survives pickling between processes (DDP ranks, remote tasks).
        return (type(self), (self.index, self.rollout_version, self.trained_version, self.max_staleness))


class AdapterArtifactError(TrainerError):
    """An adapter artifact lacks the files PEFT needs."""


class OptimizerStateError(TrainerError):
    """An optimizer-state artifact is missing, unreadable or belongs to a different adapter layout."""


@contextlib.contextmanager
def pinned_threads(threads: int) -> Iterator[None]:
    """Run the block with torch's intra-op thread count set to `threads` (a reduction's bits depend on it)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


@contextlib.contextmanager
def _quiet_peft() -> Iterator[None]:
    with warnings.catch_warnings():
        # peft 0.21 probes a property transformers 5.2x deprecated; the warning is theirs and says nothing to users.
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        yield


def _derived_seed(*parts: int) -> int:
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1  # torch.manual_seed takes a non-negative int64


# ---------------------------------------------------------------------------------------------------------------------
# Artifacts: adapter and optimizer state as bytes


def new_adapter(base_dir: Path, config: TrainerConfig, seed: int) -> PeftModel:
    """A fresh LoRA adapter on the base model in `base_dir`, its initial weights a function of `seed` alone."""
    base = load_base_model(base_dir)
    target = config.target_modules if isinstance(config.target_modules, str) else list(config.target_modules)
    lora = LoraConfig(
        r=config.lora_rank,
        lora_alpha=config.lora_alpha,
        lora_dropout=config.lora_dropout,
        target_modules=target,
        bias="none",
        task_type="CAUSAL_LM",
    )
    # Forked so seeding the adapter's init neither depends on nor disturbs the caller's RNG stream.
    with torch.random.fork_rng(devices=[]), _quiet_peft():
        torch.manual_seed(seed)
        model = get_peft_model(base, lora)
    return model


def load_policy(
    base_dir: Path, files: Mapping[str, bytes], *, trainable: bool, device: str | torch.device = "cpu"
) -> PeftModel:
    """The base model in `base_dir` with the adapter in `files` applied, on `device`; frozen unless `trainable`."""
    missing = [name for name in ADAPTER_FILES if name not in files]
    if missing:
        raise AdapterArtifactError(
            f"adapter artifact lacks {', '.join(missing)} (has {sorted(files)}); pass an adapter produced by "
            "PeftTrainer.init_adapter or train_step"
        )
    base = load_base_model(base_dir, device=device)  # straight onto the device: no host copy of the base
    with tempfile.TemporaryDirectory(prefix="adapter-") as tmp:
        for name in ADAPTER_FILES:
            (Path(tmp) / name).write_bytes(files[name])
        with _quiet_peft():
            model = PeftModel.from_pretrained(base, tmp, is_trainable=trainable)
    return model.to(device)  # the adapter's weights too (PEFT loads them beside the base; a no-op then)


def adapter_files(model: PeftModel) -> dict[str, bytes]:
    """The adapter's weights and config as artifact files, byte-identical for equal weights and equal LoRA config.

    The config is rewritten canonically: `target_modules` sorted (PEFT writes it in set order), keys sorted, and
    `base_model_name_or_path` cleared so the bytes do not depend on where the base model lives on this machine. The
    weights are the bytes `save_pretrained` writes (`tests/test_peft_trainer.py` checks it), serialised in memory: a
    step's adapter would otherwise pay for a temporary directory and a generated model card every time.
    """
    config = _CANONICAL_CONFIG.get(model)
    if config is None:
        with tempfile.TemporaryDirectory(prefix="adapter-") as tmp:
            model.save_pretrained(tmp)
            written = json.loads((Path(tmp) / "adapter_config.json").read_text())
        if isinstance(written.get("target_modules"), list):
            written["target_modules"] = sorted(written["target_modules"])
        written["base_model_name_or_path"] = None
        config = (json.dumps(written, indent=2, sort_keys=True, allow_nan=False) + "\n").encode()
        _CANONICAL_CONFIG[model] = config  # a model's LoRA config never changes; its weights do
    weights = {name: t.detach().contiguous().cpu() for name, t in _adapter_tensors(model)}
    return {
        "adapter_config.json": config,
        "adapter_model.safetensors": save_safetensors(weights, metadata={"format": "pt"}),
    }


_CANONICAL_CONFIG: weakref.WeakKeyDictionary[PeftModel, bytes] = weakref.WeakKeyDictionary()
_SAVED_TENSORS: weakref.WeakKeyDictionary[PeftModel, list[tuple[str, torch.Tensor]]] = weakref.WeakKeyDictionary()


def _adapter_tensors(model: PeftModel) -> list[tuple[str, torch.Tensor]]:
    """`get_peft_model_state_dict(model)` as (saved name, live parameter) pairs. PEFT's function walks the whole
    model's state dict on every call; the parameters it picks are looked up once per model, by storage."""
    pairs = _SAVED_TENSORS.get(model)
    if pairs is None:
        by_ptr = {p.data_ptr(): p for p in model.parameters()}
        saved = get_peft_model_state_dict(model)
        found = [(key, by_ptr.get(t.data_ptr())) for key, t in saved.items()]
        if not all(p is not None for _, p in found):
            return list(saved.items())  # not all plain parameters (never for LoRA): PEFT's dict every time
        pairs = [(key, p) for key, p in found if p is not None]
        _SAVED_TENSORS[model] = pairs
    return pairs


def trainable_parameters(model: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
    """The LoRA parameters in module order: the order the optimizer state's indices refer to."""
    return [(name, p) for name, p in model.named_parameters() if p.requires_grad]


def build_optimizer(
    params: Sequence[tuple[str, torch.nn.Parameter]], config: TrainerConfig, state: Mapping[str, bytes] | None
) -> torch.optim.AdamW:
    """AdamW over `params`, its moments and step count restored from an optimizer-state artifact's files if given."""
    optimizer = torch.optim.AdamW(
        [p for _, p in params],
        lr=config.lr,
        betas=config.betas,
        eps=config.adam_eps,
        weight_decay=config.weight_decay,
        foreach=False,  # one code path on every machine, so the bits do not depend on the kernel choice
    )
    if state is None:
        return optimizer
    saved = read_optimizer_state(state)
    names = [name for name, _ in params]
    if saved["param_names"] != names:
        raise OptimizerStateError(
            f"optimizer state covers {len(saved['param_names'])} parameters that differ from this adapter's "
            f"{len(names)}; the state and the adapter must come from the same TrainResult"
        )
    optimizer.load_state_dict(saved["state_dict"])
    return optimizer


def optimizer_files(optimizer: torch.optim.Optimizer, param_names: Sequence[str]) -> dict[str, bytes]:
    """The optimizer's state as artifact files: equal state gives equal bytes.

    Format 2 is one safetensors file: each state key's tensors (AdamW's `exp_avg`, `exp_avg_sq`, `step`) flattened and
    concatenated in parameter order into one tensor per key and dtype, with the layout, the parameter names and the
    param groups as JSON in its metadata. No pickle to load; a few tensors instead of three per parameter keeps the
    save well under a millisecond. Tensors are saved from the CPU, so the bytes name no device.
    """
    state_dict = optimizer.state_dict()
    parts: dict[str, list[torch.Tensor]] = {}
    layout: list[list[Any]] = []  # [param index, state key, tensor name, shape] in concatenation order
    for index, entry in sorted(state_dict["state"].items()):
        for key, value in sorted(entry.items()):
            if not isinstance(value, torch.Tensor):
                raise OptimizerStateError(f"optimizer state {index}.{key} is a {type(value).__name__}, not a tensor")
            name = f"{key}.{str(value.dtype).removeprefix('torch.')}"
            parts.setdefault(name, []).append(value.detach().reshape(-1).cpu())
            layout.append([index, key, name, list(value.shape)])
    tensors = {name: torch.cat(chunks) for name, chunks in parts.items()}
    # One metadata key: safetensors writes a metadata map's keys in no fixed order, and these bytes are a digest.
    about = {
        "format": _OPTIMIZER_FORMAT,
        "param_names": list(param_names),
        "param_groups": state_dict["param_groups"],
        "layout": layout,
    }
    metadata = {"optimizer": json.dumps(about, sort_keys=True, allow_nan=False)}
    return {OPTIMIZER_FILE: save_safetensors(tensors, metadata=metadata)}


def read_optimizer_state(files: Mapping[str, bytes]) -> dict[str, Any]:
    """`{"format", "param_names", "state_dict"}` from an optimizer-state artifact of format 2 or the older format 1.

    Raises:
        OptimizerStateError: no optimizer file, or one that is unreadable or of an unknown format.
    """
    if OPTIMIZER_FILE in files:
        try:
            tensors = load_safetensors(files[OPTIMIZER_FILE])
            about = json.loads(_safetensors_metadata(files[OPTIMIZER_FILE])["optimizer"])
            fmt, param_names, groups = about["format"], about["param_names"], about["param_groups"]
            state: dict[int, dict[str, torch.Tensor]] = {}
            offsets = dict.fromkeys(tensors, 0)
            for index, key, name, shape in about["layout"]:
                size = math.prod(shape)
                flat = tensors[name][offsets[name] : offsets[name] + size]
                offsets[name] += size
                state.setdefault(int(index), {})[key] = flat.reshape(shape).clone()
            if any(offsets[name] != tensors[name].numel() for name in tensors):
                raise ValueError("the layout does not cover its tensors exactly")
        except Exception as exc:
            raise OptimizerStateError(f"optimizer-state artifact's {OPTIMIZER_FILE} is unreadable: {exc}") from exc
        if fmt != _OPTIMIZER_FORMAT:
            raise OptimizerStateError(f"optimizer state has format {fmt}, this trainer reads formats 1 and 2")
        return {"format": fmt, "param_names": param_names, "state_dict": {"state": state, "param_groups": groups}}
    if LEGACY_OPTIMIZER_FILE in files:
        try:
            # Read onto the CPU; `load_state_dict` moves the moments to each parameter's device (CPU or CUDA).
            saved = torch.load(io.BytesIO(files[LEGACY_OPTIMIZER_FILE]), weights_only=True, map_location="cpu")
        except Exception as exc:
            raise OptimizerStateError(
                f"optimizer-state artifact's {LEGACY_OPTIMIZER_FILE} is unreadable: {exc}"
            ) from exc
        if not isinstance(saved, dict) or saved.get("format") != 1:
            fmt = saved.get("format") if isinstance(saved, dict) else None
            raise OptimizerStateError(f"optimizer state has format {fmt!r}, this trainer reads formats 1 and 2")
        return saved
    raise OptimizerStateError(
        f"optimizer-state artifact lacks {OPTIMIZER_FILE} (has {sorted(files)}); pass the optimizer_state of the "
        "TrainResult that produced this batch's adapter"
    )


def _safetensors_metadata(blob: bytes) -> dict[str, str]:
    """The `__metadata__` of a safetensors blob (safetensors' Python API reads metadata only from files)."""
    header_len = int.from_bytes(blob[:8], "little")
    header = json.loads(blob[8 : 8 + header_len])
    metadata = header.get("__metadata__") or {}
    if not isinstance(metadata, dict):
        raise ValueError("the safetensors header's __metadata__ is not an object")
    return {str(k): str(v) for k, v in metadata.items()}


# ---------------------------------------------------------------------------------------------------------------------
# The step


def check_batch(batch: TrainBatch, config: TrainerConfig) -> int:
    """Validate `batch` and return its largest staleness.

    The step trains version `batch.new_version - 1` into `batch.new_version`; a rollout's staleness is
    `(batch.new_version - 1) - rollout.policy_version`: 0 on-policy, 1 when pipelining one step ahead.

    Raises:
        BatchError: rewards and rollouts differ in length, `new_version < 1`, or a rollout has no completion tokens or
            a log-prob count that differs from its token count.
        RolloutVersionError: a rollout claims a policy version newer than the one being trained.
        StaleRolloutError: a rollout is more than `config.max_staleness` versions old.
    """
    if len(batch.rewards) != len(batch.rollouts):
        raise BatchError(f"batch {batch.step} has {len(batch.rollouts)} rollouts but {len(batch.rewards)} rewards")
    if batch.new_version < 1:
        raise BatchError(f"batch {batch.step} has new_version {batch.new_version}; a trained version is >= 1")
    trained = batch.new_version - 1
    worst = 0
    for i, rollout in enumerate(batch.rollouts):
        if not rollout.token_ids or not rollout.prompt_token_ids:
            raise BatchError(
                f"rollout {i} of batch {batch.step} has {len(rollout.prompt_token_ids)} prompt and "
                f"{len(rollout.token_ids)} completion tokens; both must be non-empty"
            )
        if len(rollout.logprobs) != len(rollout.token_ids):
            raise BatchError(
                f"rollout {i} of batch {batch.step} has {len(rollout.token_ids)} tokens but {len(rollout.logprobs)} "
                "sampling log-probs; the engine must record one per sampled token"
            )
        staleness = trained - rollout.policy_version
        if staleness < 0:
            raise RolloutVersionError(
                f"rollout {i} claims policy version {rollout.policy_version}, newer than the version being trained "
                f"({trained}); batch.new_version or the rollout's version is wrong"
            )
        if staleness > config.max_staleness:
            raise StaleRolloutError(i, rollout.policy_version, trained, config.max_staleness)
        worst = max(worst, staleness)
    return worst


def sample_loss_fns(
    model: PeftModel,
    batch: TrainBatch,
    advantages: Sequence[float],
    config: TrainerConfig,
    *,
    indices: Sequence[int],
    loss_scale: float,
    stats_out: list[dict[str, float]],
) -> list[Callable[[], torch.Tensor]]:
    """One closure per sample in `indices`; calling it runs that sample's forward and returns `loss_i * loss_scale`.

    The reference log-probs (the base with the adapter disabled) are computed here, for all of `indices` in one
    adapter-disabled block, one unbatched forward per sample (so a sample's values do not depend on its neighbours):
    PEFT's `disable_adapter` costs milliseconds per toggle, more than a tiny model's forward. Each closure computes the
    new log-probs with the adapter (with grad), takes the rollout's sampling log-probs as old, and returns the seed's
    per-sample GRPO loss (token mean). Building the graph only when called lets the caller backward and free one sample
    at a time. Each call appends that sample's unscaled stats (loss, ratio, kl, clip_frac) to `stats_out`.

    `loss_scale` turns the per-sample losses into the batch objective: `1 / n_contributing` in one process gives the
    mean over samples; a DDP rank uses `world_size / n_contributing` because DDP averages gradients over ranks.

    Dropout masks (if `lora_dropout > 0`) are seeded from (config seed, step, sample index), so a sample's gradient is
    the same whichever rank or position computes it.

    Shape: each closure returns a 0-d tensor; internally new/old/ref log-probs are [T_i] over sample i's completion.
    """
    with torch.no_grad(), model.disable_adapter():
        ref_logps = {
            i: teacher_forced_logprobs(model, batch.rollouts[i].prompt_token_ids, batch.rollouts[i].token_ids)  # [T_i]
            for i in indices
        }

    def make(i: int) -> Callable[[], torch.Tensor]:
        rollout = batch.rollouts[i]

        def loss_fn() -> torch.Tensor:
            torch.manual_seed(_derived_seed(config.seed, batch.step, i))
            new_logp = teacher_forced_logprobs(model, rollout.prompt_token_ids, rollout.token_ids)  # [T]
            old_logp = torch.tensor(rollout.logprobs, dtype=torch.float32, device=new_logp.device)  # [T]
            loss, stats = grpo_sample_loss(
                new_logp.float(),
                old_logp,
                ref_logps[i].float(),
                advantages[i],
                clip_eps=config.clip_eps,
                kl_beta=config.kl_beta,
                clip_eps_high=config.clip_eps_high,
            )
            stats_out.append(stats)
            return loss * loss_scale

        return loss_fn

    return [make(i) for i in indices]


@dataclass
class PreparedStep:
    """What every rank of a step holds before any gradient: the model, its optimizer and the batch's signal."""

    model: PeftModel
    params: list[tuple[str, torch.nn.Parameter]]
    optimizer: torch.optim.AdamW
    advantages: list[float]
    contributing: list[int]
    skipped: int
    max_staleness: int


def prepare_step(
    base_dir: Path,
    batch: TrainBatch,
    config: TrainerConfig,
    adapter: Mapping[str, bytes],
    optimizer_state: Mapping[str, bytes] | None,
    *,
    device: str | torch.device = "cpu",
) -> PreparedStep:
    """Check the batch, compute advantages, and load the adapter (trainable, on `device`) and its optimizer state."""
    worst, advantages, contributing = _batch_signal(batch, config)
    model = load_policy(base_dir, adapter, trainable=True, device=device)
    model.train()
    params = trainable_parameters(model)
    optimizer = build_optimizer(params, config, optimizer_state)
    return PreparedStep(
        model=model,
        params=params,
        optimizer=optimizer,
        advantages=advantages,
        contributing=contributing,
        skipped=len(advantages) - len(contributing),
        max_staleness=worst,
    )


def _batch_signal(batch: TrainBatch, config: TrainerConfig) -> tuple[int, list[float], list[int]]:
    """The batch checked: its largest staleness, its advantages and the samples that carry signal."""
    worst = check_batch(batch, config)
    advantages = group_normalized_advantages(
        [r.group_id for r in batch.rollouts], batch.rewards, scale=config.advantage_scale, eps=config.advantage_eps
    )
    return worst, advantages, [i for i, a in enumerate(advantages) if a != 0.0]


def clip_and_step(prepared: PreparedStep, config: TrainerConfig) -> float:
    """Clip the accumulated gradient to `config.max_grad_norm`, take one AdamW step, return the pre-clip norm."""
    grads = [p for _, p in prepared.params if p.grad is not None]
    norm = torch.nn.utils.clip_grad_norm_(grads, config.max_grad_norm) if grads else torch.tensor(0.0)
    prepared.optimizer.step()
    return float(norm)


def step_metrics(sums: Sequence[float], prepared: PreparedStep, grad_norm: float) -> StepMetrics:
    """StepMetrics from summed per-sample stats `sums = (loss, kl, clip_frac)` over the contributing samples."""
    n = len(prepared.contributing)
    loss, kl, clip_frac = (s / n for s in sums) if n else (0.0, 0.0, 0.0)
    return StepMetrics(
        loss=loss,
        contributing=n,
        skipped_zero_advantage=prepared.skipped,
        kl=kl,
        clip_frac=clip_frac,
        grad_norm=grad_norm,
        max_staleness=prepared.max_staleness,
    )


def stat_sums(stats: Sequence[Mapping[str, float]]) -> list[float]:
    """The (loss, kl, clip_frac) sums over per-sample stats, in the order `step_metrics` reads them."""
    return [math.fsum(s[key] for s in stats) for key in ("loss", "kl", "clip_frac")]


@dataclass
class _Warm:
    """The model and optimizer a step left in memory, and the digests of the artifacts it wrote from them."""

    adapter_digest: str
    optimizer_digest: str
    prepared: PreparedStep


class PeftTrainer:
    """The Trainer protocol on torch + PEFT, one process: LoRA adapters and AdamW state live in `artifacts`.

    Compute runs on the calling thread (an async method that blocks): in production each step is its own task, and in
    one process a worker thread would let a concurrent sampler change torch's global thread count mid-step.

    `device` is where a step's forward and backward run ("cpu", or "cuda"/"cuda:N" on a GPU). Version 0 is always
    initialised on the CPU, so its bytes are the same on every machine; artifacts never name a device.

    Warm: after a step the trainer keeps its model and optimizer in memory beside the digests of the adapter and
    optimizer artifacts it wrote. A batch naming exactly those digests continues from memory instead of loading the
    base model, the adapter and the optimizer from the artifacts; anything else (another adapter, a restarted process,
    a step that raised) loads them as before. The in-memory state is what those bytes decode to, so both paths give
    the same bytes (`tests/test_peft_trainer.py` checks it); `cold_loads` counts the loads.
    """

    def __init__(
        self,
        base_dir: Path,
        artifacts: Artifacts,
        config: TrainerConfig | None = None,
        *,
        device: str | torch.device = "cpu",
    ) -> None:
        self.base_dir = Path(base_dir)
        self.artifacts = artifacts
        self.config = config if config is not None else TrainerConfig()
        self.device = torch.device(device)
        self._warm: _Warm | None = None
        self.cold_loads = 0

    async def init_adapter(self, seed: int) -> TrainResult:
        """Version 0: a fresh LoRA adapter (a function of `seed`) and the optimizer state of a fresh AdamW."""
        with pinned_threads(self.config.threads):
            model = new_adapter(self.base_dir, self.config, seed)
            params = trainable_parameters(model)
            optimizer = build_optimizer(params, self.config, None)
            adapter = adapter_files(model)
            opt_state = optimizer_files(optimizer, [name for name, _ in params])
        adapter_ref = await self.artifacts.put(adapter, name="adapter-v0")
        opt_ref = await self.artifacts.put(opt_state, name="optimizer-v0")
        metrics = StepMetrics(loss=0.0, contributing=0, skipped_zero_advantage=0)
        return TrainResult(adapter=adapter_ref, optimizer_state=opt_ref, version=0, metrics=metrics)

    async def train_step(self, batch: TrainBatch) -> TrainResult:
        """One GRPO step on `batch`: returns adapter version `batch.new_version`, its optimizer state and metrics."""
        warm, self._warm = self._warm, None  # a step that raises must not leave a half-updated model behind
        opt_digest = batch.optimizer_state.digest if batch.optimizer_state is not None else None
        if warm is not None and (warm.adapter_digest, warm.optimizer_digest) == (batch.adapter.digest, opt_digest):
            with pinned_threads(self.config.threads), torch.random.fork_rng(devices=[]):
                prepared = prepare_warm_step(batch, self.config, warm.prepared)
                new_adapter_files, new_opt_files, metrics = run_step(batch, prepared, self.config)
        else:
            adapter = await self.artifacts.get(batch.adapter)
            opt_state = await self.artifacts.get(batch.optimizer_state) if batch.optimizer_state is not None else None
            prepared, (new_adapter_files, new_opt_files, metrics) = self._cold_step(batch, adapter, opt_state)
        adapter_ref = await self.artifacts.put(new_adapter_files, name=f"adapter-v{batch.new_version}")
        opt_ref = await self.artifacts.put(new_opt_files, name=f"optimizer-v{batch.new_version}")
        self._warm = _Warm(adapter_ref.digest, opt_ref.digest, prepared)
        return TrainResult(adapter=adapter_ref, optimizer_state=opt_ref, version=batch.new_version, metrics=metrics)

    def compute_step(
        self, batch: TrainBatch, adapter: Mapping[str, bytes], optimizer_state: Mapping[str, bytes] | None
    ) -> tuple[dict[str, bytes], dict[str, bytes], StepMetrics]:
        """The step on in-memory artifact files: (adapter files, optimizer files, metrics). Pure in its inputs."""
        return self._cold_step(batch, adapter, optimizer_state)[1]

    def _cold_step(
        self, batch: TrainBatch, adapter: Mapping[str, bytes], optimizer_state: Mapping[str, bytes] | None
    ) -> tuple[PreparedStep, tuple[dict[str, bytes], dict[str, bytes], StepMetrics]]:
        self.cold_loads += 1
        with pinned_threads(self.config.threads), torch.random.fork_rng(devices=[]):
            prepared = prepare_step(self.base_dir, batch, self.config, adapter, optimizer_state, device=self.device)
            return prepared, run_step(batch, prepared, self.config)


def prepare_warm_step(batch: TrainBatch, config: TrainerConfig, warm: PreparedStep) -> PreparedStep:
    """`prepare_step` for `batch` on a model and optimizer already holding its adapter and optimizer state."""
    worst, advantages, contributing = _batch_signal(batch, config)
    return replace(
        warm,
        advantages=advantages,
        contributing=contributing,
        skipped=len(advantages) - len(contributing),
        max_staleness=worst,
    )


def run_step(
    batch: TrainBatch, prepared: PreparedStep, config: TrainerConfig
) -> tuple[dict[str, bytes], dict[str, bytes], StepMetrics]:
    """Back-propagate the contributing samples' loss, step AdamW, and serialise the result; the model's gradients are
    cleared afterwards, so the model and optimizer are left exactly as the returned files describe them."""
    sums = [0.0, 0.0, 0.0]
    grad_norm = 0.0
    if prepared.contributing:
        scale = 1.0 / len(prepared.contributing)
        if config.loss_path == "batched":
            sums = batched_backward(
                prepared.model, batch, prepared.advantages, config, indices=prepared.contributing, loss_scale=scale
            )
        else:
            stats: list[dict[str, float]] = []
            fns = sample_loss_fns(
                prepared.model,
                batch,
                prepared.advantages,
                config,
                indices=prepared.contributing,
                loss_scale=scale,
                stats_out=stats,
            )
            for fn in fns:
                fn().backward()  # accumulate; each sample's graph is freed here
            sums = stat_sums(stats)
        grad_norm = clip_and_step(prepared, config)
        prepared.optimizer.zero_grad(set_to_none=True)
    metrics = step_metrics(sums, prepared, grad_norm)
    return (
        adapter_files(prepared.model),
        optimizer_files(prepared.optimizer, [name for name, _ in prepared.params]),
        metrics,
    )
