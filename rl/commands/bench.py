"""`rl bench`: side-by-side figures for this machine (simulator, GRPO loop on fakes; more sections as they land)."""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

from rl.commands import positive_float
from rl.strict_json import flag_non_finite

SECTIONS = ("sim", "cpu", "volumes")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("bench", help="print benchmark figures measured side by side in one run")
    p.add_argument("--json", action="store_true", help="end with one JSON object of every figure")
    p.add_argument(
        "--sections",
        default="sim,cpu,volumes",
        help="comma-separated: sim (simulator, chaos rate, pipelining), cpu (tiny-model sampler and trainer), "
        "volumes (fork vs full copy of a world)",
    )
    p.add_argument(
        "--world-gib", type=positive_float, default=1.0, help="world size for the volumes section (default 1 GiB)"
    )
    p.add_argument(
        "--gpu",
        action="store_true",
        help="instead: vLLM sampler tokens/s against HF generate, and the CUDA train step (needs CUDA and vllm)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.gpu:
        from rl.bench_gpu import run_gpu_bench

        return run_gpu_bench(json_out=args.json)
    from rl.errors import InputError

    sections = {s.strip() for s in args.sections.split(",") if s.strip()}
    unknown = sections - set(SECTIONS)
    if unknown:
        raise InputError(f"unknown section(s) {sorted(unknown)} in --sections; choose from {', '.join(SECTIONS)}")
    if not sections:
        raise InputError(f"--sections {args.sections!r} names no section; choose from {', '.join(SECTIONS)}")
    figures: dict[str, Any] = {}
    if "sim" in sections:
        from fakes.bench import simulator_bench

        figures.update(simulator_bench())
    if "cpu" in sections:
        from rl.bench_cpu import cpu_stack_bench

        figures.update(cpu_stack_bench())
    if "volumes" in sections:
        from rl.volumes.bench import bench_fork

        fork = bench_fork(int(args.world_gib * (1 << 30)))
        figures.update({f"volume_{k}": v for k, v in fork.items()})
    width = max(len(k) for k in figures)
    for key, value in figures.items():
        print(f"{key:<{width}}  {value:.4g}" if isinstance(value, float) else f"{key:<{width}}  {value}")
    if args.json:
        rounded = {k: (round(v, 6) if isinstance(v, float) and math.isfinite(v) else v) for k, v in figures.items()}
        print(json.dumps(flag_non_finite(rounded), allow_nan=False))
    return 0
