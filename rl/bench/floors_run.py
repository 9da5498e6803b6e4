"""`rl bench --sections floors` / `python -m rl.bench.floors_run --model DIR`: each phase of the demo's iteration,
timed on the real sampler and trainer, beside its floor (`rl.bench.floors`).

The iteration is `rl demo grpo`'s (tiny model: 8 x 16 x 3 tokens; `--model`: 4 x 8 x 12, `REAL_MODEL_TRAINER`), one
warm-up iteration then `repeats` timed ones, each sampling with the adapter the last step trained (the loop's warm
path). Phases are timed by wrapping the functions the real code calls, not by re-running them: `_prefill` inside the
sampler's `sample_groups` (decode is the rest of `sample_groups`), the trainer's teacher-forced forwards
(`batched_teacher_forced_logprobs`, reference and policy), `batched_backward` less those forwards (backward and
loss), `clip_and_step` (the optimizer). What lies outside them (adapter loads, tokenising, scoring, serialising,
artifact writes) is reported as `sampler_other` and `train_other`, with no floor.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rl.bench.figures import check_repeats
from rl.bench.floors import PHASES, IterationShape, MachineRates, phase_floors, ratio, table_lines
from rl.memory_plan import ModelArch, lora_parameters

if TYPE_CHECKING:
    from rl.models.opened_model import ModelDir

__all__ = ["floors_bench", "main"]


class _Timers:
    """Seconds spent in each wrapped function since the last `reset`."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def reset(self) -> None:
        self.seconds = {}

    @contextlib.contextmanager
    def wrapping(self, module: Any, name: str) -> Iterator[None]:
        """`module.name` replaced by a wrapper that adds its wall seconds under `name`; put back on exit."""
        original: Callable[..., Any] = getattr(module, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start

        setattr(module, name, timed)
        try:
            yield
        finally:
            setattr(module, name, original)


async def _iterations(root: Path, base: ModelDir, real: bool, repeats: int) -> tuple[list[dict[str, float]], list[Any]]:
    """(measured seconds per phase, rollouts) of each timed iteration on the model in `base` (`real`: a pretrained
    model, in `rl demo grpo --model`'s setting)."""
    import rl.samplers.decoding as decoding
    import rl.samplers.torch_sampler as torch_sampler
    import rl.trainer.batched_loss as batched_loss
    import rl.trainer.step as step
    from rl.deploy.demo import grpo_demo_config
    from rl.deploy.local import DEMO_TRAINER, REAL_MODEL_TRAINER, demo_problems
    from rl.loop.grpo import GrpoTiers, generate_and_score
    from rl.samplers.torch_sampler import TorchSampler
    from rl.scoring import RewardScorer
    from rl.storage.artifacts import LocalArtifacts
    from rl.trainer.peft_trainer import PeftTrainer
    from rl.types import TrainBatch

    trainer_config = REAL_MODEL_TRAINER if real else DEMO_TRAINER
    artifacts = LocalArtifacts(root / "artifacts")
    trainer = PeftTrainer(base, artifacts, trainer_config)
    sampler = TorchSampler(base, artifacts, threads=trainer_config.threads)
    config = grpo_demo_config(iterations=repeats + 1, real_model=real, prompts=4 if real else 8)  # `rl demo grpo`'s
    tiers = GrpoTiers(sampler, RewardScorer(), trainer, artifacts, demo_problems(real))
    state = await trainer.init_adapter(0)
    timers, measured, shapes = _Timers(), [], []
    wrapped = [
        (decoding, "_prefill"),
        (torch_sampler, "sample_groups"),
        (batched_loss, "batched_teacher_forced_logprobs"),
        (step, "batched_backward"),
        (step, "clip_and_step"),
    ]
    with contextlib.ExitStack() as stack:
        for module, name in wrapped:
            stack.enter_context(timers.wrapping(module, name))
        for i in range(repeats + 1):  # the first is a warm-up: first-call overheads, the adapter's first load
            timers.reset()
            start = time.perf_counter()
            rollouts = (await generate_and_score(config, tiers, i, state.adapter, state.policy_version)).rollouts
            sample_s = time.perf_counter() - start
            # Alternating rewards give every sample a non-zero advantage: the step does its full work.
            signal = [float(k % 2) for k in range(len(rollouts))]
            batch = TrainBatch(i, rollouts, signal, state.adapter, state.optimizer_state, state.policy_version + 1)
            start = time.perf_counter()
            state = await trainer.train_step(batch)
            train_s = time.perf_counter() - start
            if i:
                measured.append(_phases(timers.seconds, sample_s, train_s))
                shapes.append(rollouts)
    return measured, shapes


def _phases(s: dict[str, float], sample_s: float, train_s: float) -> dict[str, float]:
    forward, backward_all = s.get("batched_teacher_forced_logprobs", 0.0), s.get("batched_backward", 0.0)
    return {
        "prefill": s.get("_prefill", 0.0),
        "decode": s.get("sample_groups", 0.0) - s.get("_prefill", 0.0),
        "teacher_forced_forward": forward,
        "backward": backward_all - forward,
        "optimizer_step": s.get("clip_and_step", 0.0),
        "sampler_other": sample_s - s.get("sample_groups", 0.0),
        "train_other": train_s - backward_all - s.get("clip_and_step", 0.0),
        "iteration": sample_s + train_s,
    }


def floors_bench(model: str | None = None, repeats: int = 5) -> tuple[dict[str, Any], list[str]]:
    """(figures, the table's lines) for the tiny demo model, or for `model` (a pinned name such as `smollm2`, or a
    model directory): each phase's median seconds, its median floor over the repeats' shapes, their ratio."""
    check_repeats(repeats)
    from rl.deploy.local import DEMO_TRAINER, REAL_MODEL_TRAINER

    with tempfile.TemporaryDirectory(prefix="rl-bench-floors-") as tmp:
        base = _model_dir(model, Path(tmp))
        arch = ModelArch.from_hf_config(base.json("config.json"))  # as the door read it
        measured, rollouts = asyncio.run(_iterations(Path(tmp), base, model is not None, repeats))
    trainer = REAL_MODEL_TRAINER if model is not None else DEMO_TRAINER
    rates = MachineRates.measure(arch, trainer.threads)
    lora = lora_parameters(arch, trainer.lora_rank, trainer.target_modules)
    floors = _median_floors(arch, rollouts, rates, lora, trainer.kl_beta > 0)
    figures: dict[str, Any] = {
        "floors_model": model if model is not None else "tiny",
        "floors_matmul_gflops": rates.matmul_gflops,
        "floors_bandwidth_gbs": rates.bandwidth_gbs,
        "floors_threads": rates.threads,
        "floors_repeats": repeats,
    }
    rows = []
    for phase in (*PHASES, "sampler_other", "train_other", "iteration"):
        value = statistics.median(m[phase] for m in measured)
        floor = floors.get(phase, 0.0)
        figures[f"floors_{phase}_s"] = value
        if floor > 0:
            figures[f"floors_{phase}_floor_s"] = floor
            figures[f"floors_{phase}_ratio"] = ratio(value, floor)
        rows.append((phase, value, floor))
    lines = [
        f"floors: {figures['floors_model']}, {_shape_text(rollouts[0])}, median of {repeats}; "
        f"fp32 matmul {rates.matmul_gflops:.1f} GFLOP/s, memory {rates.bandwidth_gbs:.1f} GB/s, "
        f"{rates.threads} threads",
        *table_lines(rows),
    ]
    return figures, lines


def _model_dir(model: str | None, root: Path) -> ModelDir:
    """The opened directory of `model` (`rl.models.pretrained.resolve_model`), or of the tiny demo model built under
    `root`."""
    if model is not None:
        from rl.models.pretrained import resolve_model

        return resolve_model(model)
    from rl.deploy.local import DEMO_MODEL, base_model

    return base_model(root, DEMO_MODEL)


def _median_floors(arch: ModelArch, rollouts: list[Any], rates: MachineRates, lora: int, ref: bool) -> dict[str, float]:
    """Each phase's median floor over the timed iterations (each sampled its own completions), and the iteration's."""
    shapes = [IterationShape.from_rollouts(r) for r in rollouts]
    per = [{f.phase: f.floor_s for f in phase_floors(arch, s, rates, lora=lora, reference=ref)} for s in shapes]
    out = {phase: statistics.median(p[phase] for p in per) for phase in PHASES}
    out["iteration"] = statistics.median(sum(p.values()) for p in per)
    return out


def _shape_text(rollouts: list[Any]) -> str:
    shape = IterationShape.from_rollouts(rollouts)
    seqs = shape.sequences()
    prompt = sum(p for p, _ in shape.groups) / len(shape.groups)
    return (
        f"{len(shape.groups)} prompts x {len(seqs) // len(shape.groups)} samples, prompts {prompt:.0f} tokens, "
        f"completions {sum(t for _, t in seqs) / len(seqs):.1f} tokens on average"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rl.bench.floors_run", description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="a pinned model (smollm2) or a model directory; default tiny")
    parser.add_argument("--repeats", type=int, default=3, help="timed iterations after one warm-up (default 3)")
    args = parser.parse_args(argv)
    _, lines = floors_bench(args.model, args.repeats)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
