"""`rl bench`: side-by-side figures for this machine; `rl.bench` measures them, one module per section."""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

from rl.argtypes import positive_float, positive_int
from rl.bench.figures import figure_lines
from rl.strict_json import flag_non_finite

SECTIONS = ("sim", "cpu", "volumes", "vllm", "floors")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("bench", help="print benchmark figures measured side by side in one run")
    p.add_argument("--json", action="store_true", help="end with one JSON object of every figure")
    p.add_argument(
        "--sections",
        default="sim,cpu,volumes,floors",
        help="comma-separated: sim (simulator, chaos rate, pipelining), cpu (tiny-model sampler and trainer), "
        "volumes (fork vs full copy of a world), vllm (real vLLM's CPU build vs the torch sampler, same model and "
        "shape; needs vllm installed, as in nox -s vllm-cpu; not a default), floors (each phase of the demo's "
        "iteration beside its floor at this machine's matmul rate and memory bandwidth; --model picks the model)",
    )
    p.add_argument(
        "--model",
        default=None,
        help="floors and vllm sections: a pinned model (smollm2) or a model directory, in `rl demo grpo --model`'s "
        "setting; vllm then times one group, an iteration's groups and the held-out evaluation on both engines "
        "(default: the tiny demo model, and for vllm its 128-wide test model)",
    )
    p.add_argument(
        "--world-gib", type=positive_float, default=1.0, help="world size for the volumes section (default 1 GiB)"
    )
    p.add_argument(
        "--repeats",
        type=positive_int,
        default=5,
        help="times each cpu figure and each one-process chaos rate is measured (the chaos rate on new seeds each "
        "time); it prints the median and the min-max (default 5)",
    )
    p.add_argument(
        "--gpu",
        action="store_true",
        help="instead: vLLM sampler tokens/s against HF generate, and the CUDA train step (needs CUDA and vllm)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.gpu:
        from rl.bench.gpu import run_gpu_bench

        return run_gpu_bench(json_out=args.json)
    from rl.errors import InputError

    sections = {s.strip() for s in args.sections.split(",") if s.strip()}
    unknown = sections - set(SECTIONS)
    if unknown:
        raise InputError(f"unknown section(s) {sorted(unknown)} in --sections; choose from {', '.join(SECTIONS)}")
    if not sections:
        raise InputError(f"--sections {args.sections!r} names no section; choose from {', '.join(SECTIONS)}")
    if args.model is not None and not sections & {"floors", "vllm"}:
        raise InputError(
            f"--model picks the floors and vllm sections' model; add floors or vllm to --sections {args.sections!r}"
        )
    figures: dict[str, Any] = {}
    if "sim" in sections:
        from rl.bench.sim import simulator_bench

        figures.update(simulator_bench(repeats=args.repeats))
    if "cpu" in sections:
        from rl.bench.cpu import cpu_stack_bench

        figures.update(cpu_stack_bench(repeats=args.repeats))
    if "volumes" in sections:
        from rl.bench.volumes import bench_fork

        fork = bench_fork(int(args.world_gib * (1 << 30)))
        figures.update({f"volume_{k}": v for k, v in fork.items()})
    if "vllm" in sections:
        if args.model is not None:
            from rl.bench.vllm_real import vllm_real_model_bench

            figures.update(vllm_real_model_bench(args.model, repeats=args.repeats))
        else:
            from rl.bench.vllm_cpu import vllm_cpu_bench

            figures.update(vllm_cpu_bench(repeats=args.repeats))
    tables: list[str] = []
    floor_figures: dict[str, Any] = {}
    if "floors" in sections:
        from rl.bench.floors_run import floors_bench

        floor_figures, tables = floors_bench(args.model, repeats=args.repeats)
    for line in figure_lines(figures) if figures else []:
        print(line)
    for line in tables:  # a table of its own: its figures go to the JSON line only
        print(line)
    figures.update(floor_figures)
    if args.json:
        rounded = {k: (round(v, 6) if isinstance(v, float) and math.isfinite(v) else v) for k, v in figures.items()}
        print(json.dumps(flag_non_finite(rounded), allow_nan=False))
    return 0
