"""One GRPO step as a pure function of (base model, adapter, optimizer state, batch): check, prepare, back-propagate.

Everything a step needs comes in as artifact files and everything it produces goes out as artifact files, so a
retried or replayed step recomputes the same bytes: the thread count is pinned and every random draw is seeded from
(config seed, step, sample). The objective is `rl.algorithm.loss`'s, evaluated in padded micro-batches
(`rl.trainer.batched_loss`; tests check it against a per-sample reference, `tests/loss_reference.py`). Zero-advantage
samples are skipped entirely, surrogate *and* KL term, so a batch in which no sample carries signal takes no optimizer
step: the new version's adapter and optimizer state are byte-identical to the old ones. Why:
docs/design.md#the-train-step.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace

import torch
from peft import PeftModel

from rl.algorithm.advantages import group_normalized_advantages
from rl.algorithm.checks import check_staleness
from rl.errors import BatchError
from rl.models.opened_model import ModelDir
from rl.trainer.adapter import adapter_files, load_policy, trainable_parameters
from rl.trainer.batched_loss import batched_backward
from rl.trainer.config import TrainerConfig
from rl.trainer.optimizer_state import build_optimizer, optimizer_files
from rl.types import StepMetrics, TrainBatch

__all__ = [
    "PreparedStep",
    "check_batch",
    "clip_and_step",
    "pinned_threads",
    "prepare_step",
    "prepare_warm_step",
    "run_step",
    "step_metrics",
]


@contextlib.contextmanager
def pinned_threads(threads: int) -> Iterator[None]:
    """Run the block with torch's intra-op thread count set to `threads` (a reduction's bits depend on it)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def check_batch(batch: TrainBatch, config: TrainerConfig) -> int:
    """Validate `batch` and return its largest staleness.

    The step trains version `batch.new_version - 1` into `batch.new_version`; a rollout's staleness is
    `(batch.new_version - 1) - rollout.policy_version`: 0 on-policy, 1 when pipelining one step ahead.

    Raises:
        BatchError: rewards and rollouts differ in length, `new_version < 1`, or a rollout has no completion tokens or
            a log-prob count that differs from its token count.
        StaleBatchError: a rollout claims a policy version newer than the one being trained, or is more than
            `config.max_staleness` versions old (`rl.algorithm.checks.check_staleness`).
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
        worst = max(worst, check_staleness(i, rollout.policy_version, trained, config.max_staleness))
    return worst


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
    base_dir: ModelDir,
    batch: TrainBatch,
    config: TrainerConfig,
    adapter: Mapping[str, bytes],
    optimizer_state: Mapping[str, bytes] | None,
    *,
    device: str | torch.device = "cpu",
) -> PreparedStep:
    """Check the batch, compute advantages, and load the adapter (trainable, on `device`) and its optimizer state."""
    worst, advantages, contributing = _batch_signal(batch, config)
    model = load_policy(base_dir, adapter, trainable=True, device=device, config=config)
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
        [r.group_id for r in batch.rollouts], batch.rewards, scale=config.advantage_scale, eps=config.std_eps
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
        sums = batched_backward(
            prepared.model, batch, prepared.advantages, config, indices=prepared.contributing, loss_scale=scale
        )
        grad_norm = clip_and_step(prepared, config)
        prepared.optimizer.zero_grad(set_to_none=True)
    metrics = step_metrics(sums, prepared, grad_norm)
    return (
        adapter_files(prepared.model),
        optimizer_files(prepared.optimizer, [name for name, _ in prepared.params]),
        metrics,
    )
