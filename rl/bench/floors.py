"""The floor of each phase of one GRPO iteration: its FLOPs at this machine's fp32 matmul rate, its bytes at its memory
bandwidth, whichever takes longer (formulas: docs/benchmarks.md#the-real-models-iteration-against-its-floor).

Per token a forward costs 2 x (the decoder layers' linear weights) FLOPs, 4 x layers x q_width x (positions attended)
for attention, and 2 x vocab x hidden for the output head at each position whose logits are read. Prefill forwards
each prompt once (head at its last position); decode forwards each sequence's tokens after its first (head each time)
and reads every weight once per step of the batch; the trainer's teacher-forced forwards (reference and policy) cover
prompt + completion, head at the completion's positions; the backward is the policy forward's activation gradients
(attention twice) plus 4 x LoRA parameters per token; the optimizer moves 40 bytes per LoRA parameter.
`MachineRates.measure` times torch.matmul and a large tensor's sum and copy; `rl.bench.floors_run` times the real
sampler and trainer and prints the table (`rl bench --sections floors`, `python -m rl.bench.floors_run --model DIR`).
"""

from __future__ import annotations

import functools
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from rl.errors import InputError
from rl.memory_plan import ModelArch

__all__ = ["PHASES", "IterationShape", "MachineRates", "PhaseFloor", "phase_floors", "table_lines"]

PHASES = ("prefill", "decode", "teacher_forced_forward", "backward", "optimizer_step")
FP32 = 4  # bytes per element: the CPU stack runs float32 throughout
OPTIMIZER_BYTES_PER_PARAMETER = 40  # AdamW reads p, g, m, v and writes p, m, v (28); clipping reads g, scales it (12)
BANDWIDTH_BYTES = 512 << 20  # twice this machine's 260 MiB L3: the sum and copy run from memory, not from cache


@dataclass(frozen=True)
class MachineRates:
    """What this machine reaches with `threads` torch threads: fp32 matmul GFLOP/s and memory GB/s (1e9 each)."""

    matmul_gflops: float
    bandwidth_gbs: float
    threads: int

    @classmethod
    def measure(cls, arch: ModelArch, threads: int, repeats: int = 3, nbytes: int = BANDWIDTH_BYTES) -> MachineRates:
        """The best median over the model's layer shapes ([256 x in] @ [in x out]); the faster of a sum (reads) and a
        copy (reads and writes) of `nbytes`."""
        previous = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            shapes = {(a, b) for a, b in arch.module_shapes().values()}
            rates = []
            for a, b in sorted(shapes):
                x, w = torch.randn(256, a), torch.randn(a, b)  # [tokens, in], [in, out]
                rates.append(2 * 256 * a * b / _median_s(functools.partial(torch.matmul, x, w), repeats) / 1e9)
            big = torch.ones(nbytes // FP32)
            dst = torch.empty_like(big)
            read = nbytes / _median_s(lambda: big.sum(), repeats)
            copy = 2 * nbytes / _median_s(lambda: dst.copy_(big), repeats)
        finally:
            torch.set_num_threads(previous)
        return cls(matmul_gflops=max(rates), bandwidth_gbs=max(read, copy) / 1e9, threads=threads)


def _median_s(call: Callable[[], object], repeats: int) -> float:
    """The median wall seconds of `repeats` calls of `call` after one warm-up call."""
    call()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return max(statistics.median(times), 1e-9)


@dataclass(frozen=True)
class IterationShape:
    """One iteration's work: per group, its prompt's tokens and each sample's completion tokens."""

    groups: tuple[tuple[int, tuple[int, ...]], ...]

    def __post_init__(self) -> None:
        if not self.groups:
            raise InputError("an iteration has at least one group")
        for prompt, completions in self.groups:
            if prompt < 1 or not completions or min(completions) < 1:
                raise InputError(f"a group needs a prompt token and samples of >= 1 token, got {prompt}, {completions}")

    @classmethod
    def uniform(cls, prompts: int, samples: int, prompt_tokens: int, completion_tokens: int) -> IterationShape:
        """`prompts` groups of `samples` sequences, every prompt and completion of the same length."""
        return cls(tuple((prompt_tokens, (completion_tokens,) * samples) for _ in range(prompts)))

    @classmethod
    def from_rollouts(cls, rollouts: Sequence[object]) -> IterationShape:
        """The shape of sampled rollouts (`rl.types.Rollout`s), grouped by `group_id`."""
        groups: dict[int, tuple[int, list[int]]] = {}
        for r in rollouts:
            _, lengths = groups.setdefault(r.group_id, (len(r.prompt_token_ids), []))  # type: ignore[attr-defined]
            lengths.append(len(r.token_ids))  # type: ignore[attr-defined]
        return cls(tuple((p, tuple(c)) for p, c in groups.values()))

    def sequences(self) -> list[tuple[int, int]]:
        """(prompt tokens, completion tokens) of each sequence."""
        return [(p, t) for p, ts in self.groups for t in ts]


@dataclass(frozen=True)
class PhaseFloor:
    """One phase's least work and the time it takes at `MachineRates`: the larger of compute and memory time."""

    phase: str
    flops: float
    bytes: float
    floor_s: float


def layer_linear_parameters(arch: ModelArch) -> int:
    """The decoder layers' linear weights (what every position multiplies), all layers."""
    return arch.layers * sum(a * b for a, b in arch.module_shapes().values())


def attention_flops(arch: ModelArch, tokens: int, past: int) -> float:
    """QK^T and AV for `tokens` new positions after `past` cached ones: position i attends to past + i positions."""
    attended = tokens * past + tokens * (tokens + 1) / 2
    return 4.0 * arch.layers * arch.q_width * attended


def forward_flops(arch: ModelArch, tokens: int, past: int, head_positions: int, lora: int = 0) -> float:
    """One forward of `tokens` positions: linear layers, attention, the head where its logits are read, and `lora`
    LoRA parameters applied per position (unmerged: x A then (x A) B)."""
    body = 2.0 * tokens * (layer_linear_parameters(arch) + lora)
    return body + attention_flops(arch, tokens, past) + 2.0 * head_positions * arch.vocab * arch.hidden


def _floor(phase: str, flops: float, moved: float, rates: MachineRates) -> PhaseFloor:
    seconds = max(flops / (rates.matmul_gflops * 1e9), moved / (rates.bandwidth_gbs * 1e9))
    return PhaseFloor(phase, flops, moved, seconds)


def phase_floors(
    arch: ModelArch, shape: IterationShape, rates: MachineRates, *, lora: int, reference: bool = True
) -> list[PhaseFloor]:
    """The floor of each of `PHASES` for `shape` (`lora`: the adapter's parameters; `reference`: the trainer runs the
    adapter-off reference forward, as it does when kl_beta > 0). Weights read: the linear layers and the head."""
    weights = FP32 * (layer_linear_parameters(arch) + arch.vocab * arch.hidden)
    seqs = shape.sequences()
    prefill = sum(forward_flops(arch, p, 0, 1) for p, _ in shape.groups)
    decode = sum(forward_flops(arch, 1, p + t - 1, 1) for p, n in seqs for t in range(1, n))
    steps = max(n for _, n in seqs) - 1  # one batched step reads every weight once
    forwards = 2 if reference else 1
    # The trainer forwards each group's prompt once (head at its last position: completion token 0) and each sample's
    # first n - 1 completion tokens on its cache (head at each: tokens 1 .. n - 1).
    teacher = sum(
        forward_flops(arch, p, 0, 1, lora)
        + (forwards - 1) * forward_flops(arch, p, 0, 1)
        + sum(
            forward_flops(arch, n - 1, p, n - 1, lora) + (forwards - 1) * forward_flops(arch, n - 1, p, n - 1)
            for n in ns
        )
        for p, ns in shape.groups
    )
    backward = sum(
        forward_flops(arch, p, 0, 1)
        + attention_flops(arch, p, 0)
        + 4.0 * lora * p
        + sum(forward_flops(arch, n - 1, p, n - 1) + attention_flops(arch, n - 1, p) + 4.0 * lora * (n - 1) for n in ns)
        for p, ns in shape.groups
    )
    return [
        _floor("prefill", prefill, weights, rates),
        _floor("decode", decode, steps * weights, rates),
        _floor("teacher_forced_forward", teacher, forwards * weights, rates),
        _floor("backward", backward, weights, rates),
        _floor("optimizer_step", 0.0, OPTIMIZER_BYTES_PER_PARAMETER * lora, rates),
    ]


def ratio(measured_s: float, floor_s: float) -> float:
    """measured / floor; inf for a floor of zero (nothing to compare with)."""
    return measured_s / floor_s if floor_s > 0 else math.inf


def table_lines(rows: Sequence[tuple[str, float, float]]) -> list[str]:
    """A markdown table: one row per (phase, measured s, floor s) with measured / floor; `-` where the floor is 0
    (time outside the phases, which no floor bounds)."""
    out = ["| phase | measured s | floor s | measured / floor |", "| --- | --- | --- | --- |"]
    for phase, measured, floor in rows:
        shown = f"{floor:.3g} | {ratio(measured, floor):.3g}" if floor > 0 else "- | -"
        out.append(f"| {phase} | {measured:.4g} | {shown} |")
    return out
