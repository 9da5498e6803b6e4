"""Broken engines, trainers and losses for the token-level laws (issue 47 §1 items 3 and 5), each a bug a real library
shipped; the suite must fail each on the law that names it."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any
from unittest import mock

from rl.conformance import Implementation
from rl.conformance.bindings.ours import REAL_CPU, memory_version0_adapter, peft_trainer
from rl.deploy.simulated.grpo_tiers import DIGITS, MemoryEngine, MemoryTrainer
from rl.protocols import Artifacts
from rl.types import Rollout, RolloutRequest, TrainBatch, TrainResult

if TYPE_CHECKING:  # torch is imported when a binding runs: the self-test imports this module in pytester's snapshot
    import torch

BOS = DIGITS + 1


class DoubleBosEngine(MemoryEngine):
    """Declares a BOS and prompts with two: the template's own BOS, then the one the tokenizer adds."""

    bos_token_id = BOS

    async def generate(self, request: RolloutRequest) -> list[Rollout]:
        return [replace(r, prompt_token_ids=[BOS, BOS, *r.prompt_token_ids]) for r in await super().generate(request)]


class BosStrippingTrainer(MemoryTrainer):
    """The in-memory trainer on prompts that begin with BOS ids: it reads the prompt's row after them."""

    async def train_step(self, batch: TrainBatch) -> TrainResult:
        rollouts = [replace(r, prompt_token_ids=[t for t in r.prompt_token_ids if t != BOS]) for r in batch.rollouts]
        return await super().train_step(replace(batch, rollouts=rollouts))


class EosOnlyEngine(MemoryEngine):
    """Declares two stop ids, `<eos>` (10) and digit 3 (a turn terminator), but stops only at `<eos>`: a completion
    whose first token is 3 goes on to `<eos>`."""

    eos_token_id = DIGITS
    stop_token_ids = (DIGITS, 3)

    async def generate(self, request: RolloutRequest) -> list[Rollout]:
        return [
            replace(r, token_ids=[*r.token_ids, DIGITS], logprobs=[*r.logprobs, math.log(0.5)])
            for r in await super().generate(request)
        ]


class RightPaddingEngine(MemoryEngine):
    """Batches one call's requests by padding each prompt on the right to the longest (TRL PR #3722's padding side):
    the shorter prompt is sampled in the context of its pads. Alone, a request is never padded."""

    async def generate_groups(self, requests: Sequence[RolloutRequest]) -> list[list[Rollout]]:
        width = max(len(r.prompt.question) for r in requests)
        out = []
        for request in requests:
            padded = replace(request, prompt=replace(request.prompt, question=request.prompt.question.ljust(width)))
            group = await self.generate(padded)
            out.append([replace(r, question=request.prompt.question) for r in group])
        return out


def _memory(name: str, engine: Any, trainer: Any = MemoryTrainer) -> Implementation:
    return Implementation(name=name, engine=engine, adapter=memory_version0_adapter, trainer=trainer)


DOUBLE_BOS_ENGINE = _memory("double-bos-engine", DoubleBosEngine, BosStrippingTrainer)
EOS_ONLY_ENGINE = _memory("eos-only-engine", EosOnlyEngine)
RIGHT_PADDING_ENGINE = _memory("right-padding-engine", RightPaddingEngine)


def _pad_between(
    model: Any,
    prompts: Sequence[Sequence[int]],
    completions: Sequence[Sequence[int]],
    pad: int,
    *sampling: Any,
    **options: Any,
) -> Any:
    """Teacher forcing on prompts right-padded to the longest, each completion appended after the pads: PAD between a
    prompt and its completion (TRL PR #3722)."""
    from rl.samplers.decoding import batched_teacher_forced_logprobs

    width = max(len(p) for p in prompts)
    padded = [[*p, *[pad] * (width - len(p))] for p in prompts]
    return batched_teacher_forced_logprobs(model, padded, completions, pad, *sampling, **options)


class _Patched:
    """`peft_trainer` whose step runs with `rl.trainer.batched_loss.<name>` replaced by `fn`."""

    def __init__(self, artifacts: Artifacts, name: str, fn: Any) -> None:
        self.inner, self.name, self.fn = peft_trainer(artifacts), name, fn

    @contextlib.contextmanager
    def patched(self) -> Iterator[None]:
        from rl.trainer import batched_loss

        with mock.patch.object(batched_loss, self.name, self.fn):
            yield

    async def init_adapter(self, seed: int) -> TrainResult:
        return await self.inner.init_adapter(seed)

    async def train_step(self, batch: TrainBatch) -> TrainResult:
        with self.patched():
            return await self.inner.train_step(batch)


def pad_between_trainer(artifacts: Artifacts) -> _Patched:
    return _Patched(artifacts, "batched_teacher_forced_logprobs", _pad_between)


PAD_BETWEEN_TRAINER = replace(REAL_CPU, name="pad-between-trainer", trainer=pad_between_trainer)


def _numerator_only(model: Any, batch: TrainBatch, advantages: Any, config: Any, **kw: Any) -> Any:
    """Leaves truncated completions (last token not `<eos>`) out of the token sum but not out of the count it is
    divided by: `loss_scale` stays 1 / (every contributing sample), their losses are recorded as 0."""
    eos = 1  # the tiny model's `<eos>`
    indices = kw.pop("indices")
    kept = [i for i in indices if batch.rollouts[i].token_ids[-1] == eos]
    stats = kw["stats_out"]
    for key in stats:
        stats[key].extend([0.0] * (len(indices) - len(kept)))
    return _REAL_LOSS_FNS[0](model, batch, advantages, config, indices=kept, **kw) if kept else []


_REAL_LOSS_FNS: list[Any] = []


def numerator_only_trainer(artifacts: Artifacts) -> _Patched:
    from rl.trainer.batched_loss import batched_loss_fns

    _REAL_LOSS_FNS[:] = [batched_loss_fns]
    return _Patched(artifacts, "batched_loss_fns", _numerator_only)


MASKS_NUMERATOR_ONLY = replace(
    REAL_CPU,
    name="masks-numerator-only",
    trainer=numerator_only_trainer,
    algorithm=replace(REAL_CPU.algorithm, truncated_completions="masked"),
)

BASE_AS_REFERENCE = replace(
    REAL_CPU, name="base-as-reference", algorithm=replace(REAL_CPU.algorithm, kl_reference="initial_adapter")
)
"""Our trainer (its reference: the base, the adapter disabled) declared to keep the starting adapter as reference:
what TRL promised for a pretrained PEFT adapter and PR #6591's path did not do."""


def _row_sums(micro_batch: tuple[torch.Tensor, ...], clip_eps: float, kl_beta: float) -> torch.Tensor:
    from rl.algorithm.loss import grpo_masked_row_losses

    new, old, ref, advantages, mask = micro_batch
    rows, _ = grpo_masked_row_losses(new, old, ref, advantages, mask.bool(), clip_eps=clip_eps, kl_beta=kl_beta)
    return rows.sum()


def per_step_loss(
    micro_batches: Sequence[tuple[torch.Tensor, ...]],
    *,
    gradient_accumulation_steps: int,
    clip_eps: float,
    kl_beta: float,
) -> list[torch.Tensor]:
    """Our sequence-mean loss (`rl.algorithm.loss.grpo_masked_row_losses`) accumulated as our step scales it: each
    micro-batch's row sum times 1 / (samples in its optimizer step)."""
    rows = sum(len(m[0]) for m in micro_batches[:gradient_accumulation_steps])
    return [_row_sums(m, clip_eps, kl_beta) / rows for m in micro_batches]


def per_generation_loss(
    micro_batches: Sequence[tuple[torch.Tensor, ...]],
    *,
    gradient_accumulation_steps: int,
    clip_eps: float,
    kl_beta: float,
) -> list[torch.Tensor]:
    """The same, each micro-batch divided by the samples of the whole generation batch (TRL PR #6024's normaliser)."""
    rows = sum(len(m[0]) for m in micro_batches)
    return [_row_sums(m, clip_eps, kl_beta) / rows for m in micro_batches]


PER_STEP_NORMALISER = Implementation(name="per-step-normaliser", accumulated_loss=per_step_loss)
PER_GENERATION_NORMALISER = Implementation(name="per-generation-normaliser", accumulated_loss=per_generation_loss)


# -- correct implementations of the non-default declarations (test_declared_algorithm.py counts them) ----------------


def _masks_truncated(batch: TrainBatch, config: Any) -> Any:
    """`rl.trainer.step._batch_signal` with truncated completions (last token not `<eos>`) out of the contributing
    samples: out of the token sum and of the count it is divided by; the advantages stay the whole batch's."""
    worst, advantages, contributing = _REAL_SIGNAL[0](batch, config)
    return worst, advantages, [i for i in contributing if batch.rollouts[i].token_ids[-1] == 1]  # 1: `<eos>`


_REAL_SIGNAL: list[Any] = []


class _PatchedStep(_Patched):
    @contextlib.contextmanager
    def patched(self) -> Iterator[None]:
        from rl.trainer import step

        with mock.patch.object(step, self.name, self.fn):
            yield


def masking_trainer(artifacts: Artifacts) -> _Patched:
    from rl.trainer.step import _batch_signal

    _REAL_SIGNAL[:] = [_batch_signal]
    return _PatchedStep(artifacts, "_batch_signal", _masks_truncated)


MASKS_TRUNCATED = replace(
    REAL_CPU,
    name="masks-truncated",
    trainer=masking_trainer,
    algorithm=replace(REAL_CPU.algorithm, truncated_completions="masked"),
)
"""Our trainer leaving truncated completions out of the loss, both sides: right under truncated_completions="masked"."""


class InitialAdapterReference:
    """Our trainer whose KL reference is the adapter its first step started from, frozen: the reference forward
    (`adapters_off`) runs with that adapter's LoRA weights loaded in place of the current ones."""

    def __init__(self, artifacts: Artifacts) -> None:
        self.inner, self.artifacts = peft_trainer(artifacts), artifacts
        self.initial: dict[str, Any] | None = None

    async def init_adapter(self, seed: int) -> TrainResult:
        return await self.inner.init_adapter(seed)

    @contextlib.contextmanager
    def _initial_as_reference(self, model: Any) -> Iterator[None]:
        from peft import get_peft_model_state_dict, set_peft_model_state_dict

        current = {k: v.detach().clone() for k, v in get_peft_model_state_dict(model).items()}
        set_peft_model_state_dict(model, self.initial)
        try:
            yield
        finally:
            set_peft_model_state_dict(model, current)

    async def train_step(self, batch: TrainBatch) -> TrainResult:
        if self.initial is None:
            from safetensors.torch import load

            files = await self.artifacts.get(batch.adapter)
            self.initial = load(files["adapter_model.safetensors"])
        from rl.trainer import batched_loss

        with mock.patch.object(batched_loss, "adapters_off", self._initial_as_reference):
            return await self.inner.train_step(batch)


INITIAL_ADAPTER_REFERENCE = replace(
    REAL_CPU,
    name="initial-adapter-reference",
    trainer=InitialAdapterReference,
    algorithm=replace(REAL_CPU.algorithm, kl_reference="initial_adapter"),
)
"""Passes under kl_reference='initial_adapter'."""

GENERATION_MEAN_NORMALISER = Implementation(
    name="generation-mean-normaliser",
    accumulated_loss=lambda micro_batches, *, gradient_accumulation_steps, **kw: [
        loss * len(micro_batches) / gradient_accumulation_steps
        for loss in per_generation_loss(micro_batches, gradient_accumulation_steps=gradient_accumulation_steps, **kw)
    ],
    algorithm=replace(REAL_CPU.algorithm, step_normaliser="generation_mean"),
)
"""The generation batch's normaliser scaled to one step, as TRL 1.9.1 does: step_normaliser="generation_mean"."""

DECLARED = {
    "MASKS_TRUNCATED": MASKS_TRUNCATED,
    "INITIAL_ADAPTER_REFERENCE": INITIAL_ADAPTER_REFERENCE,
    "GENERATION_MEAN_NORMALISER": GENERATION_MEAN_NORMALISER,
}
