"""One GRPO step as a pure function of (base model, adapter, optimizer state, batch): check, prepare, back-propagate.

Everything a step needs comes in as artifact files and everything it produces goes out as artifact files, so a
retried or replayed step recomputes the same bytes: the thread count is pinned and every random draw is seeded from
(config seed, step, sample). The objective is `rl.algorithm.loss`'s, evaluated along `TrainerConfig.loss_path`:
`batched` (`rl.trainer.batched_loss`, one padded forward per micro-batch; the default) or `per_sample`
(`sample_loss_fns` here, the reference the batched path is tested against). Zero-advantage samples are skipped entirely,
surrogate *and* KL term, so a batch in which no sample carries signal takes no optimizer step: the new version's adapter
and optimizer state are byte-identical to the old ones. Why: docs/design.md#the-train-step.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from peft import PeftModel

from rl.algorithm.advantages import group_normalized_advantages
from rl.algorithm.checks import check_staleness
from rl.algorithm.loss import grpo_sample_loss
from rl.errors import BatchError
from rl.samplers.decoding import teacher_forced_logprobs
from rl.seeding import dropout_seed
from rl.trainer.adapter import adapter_files, load_policy, trainable_parameters
from rl.trainer.batched_loss import batched_backward, seed_dropout
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
    "sample_loss_fns",
    "stat_sums",
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

    The reference log-probs (the base with the adapter disabled) are computed here for all of `indices`, in one
    adapter-disabled block of unbatched forwards; each closure computes the new log-probs with the adapter (with grad),
    takes the rollout's sampling log-probs as old, and returns the per-sample GRPO loss (token mean), so the caller can
    backward and free one sample at a time. Each call appends that sample's unscaled stats (loss, ratio, kl, clip_frac)
    to `stats_out`. `loss_scale` is `1 / n_contributing` in one process, `world_size / n_contributing` on a DDP rank.
    Dropout masks are seeded by `rl.seeding.dropout_seed` (config seed, step, sample index). Why each of these:
    docs/design.md#the-train-step.

    Shape: each closure returns a 0-d tensor; internally new/old/ref log-probs are [T_i] over sample i's completion.
    """
    with torch.no_grad(), model.disable_adapter():
        ref_logps = {
            i: teacher_forced_logprobs(
                model, batch.rollouts[i].prompt_token_ids, batch.rollouts[i].token_ids, batch.sampling
            )  # [T_i]
            for i in indices
        }

    def make(i: int) -> Callable[[], torch.Tensor]:
        rollout = batch.rollouts[i]

        def loss_fn() -> torch.Tensor:
            seed_dropout(model, dropout_seed(config.seed, batch.step, i))
            new_logp = teacher_forced_logprobs(
                model, rollout.prompt_token_ids, rollout.token_ids, batch.sampling
            )  # [T]
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


def stat_sums(stats: Sequence[Mapping[str, float]]) -> list[float]:
    """The (loss, kl, clip_frac) sums over per-sample stats, in the order `step_metrics` reads them."""
    return [math.fsum(s[key] for s in stats) for key in ("loss", "kl", "clip_frac")]


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
