"""`python -m peers.bench_trl`: our CPU GRPO loop and TRL's `GRPOTrainer` side by side, what `nox -s bench-peers` runs.

Per shape and seed it runs our loop (`peers.bench_ours`) then TRL's (`peers.trl_loop`), each in a fresh process with
one torch thread, interleaved (ours s0, TRL s0, ours s1, TRL s1, ...) so that a machine slowing down or speeding up
over the run weighs on both sides alike; then prints one table per shape (`peers.bench_summary`). Needs TRL installed
(`nox -s bench-peers` builds that environment).

    python -m peers.bench_trl --seeds 3 --shapes demo,large           # the defaults
    python -m peers.bench_trl --seeds 1 --iterations 6 --shapes demo  # a quick look
    python -m peers.bench_trl --seeds 1 --iterations 6 --shapes smollm2  # the real model (minutes), then held-out
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from peers.bench_shapes import DEFAULT_SHAPES, SHAPES, RunRecord
from peers.bench_summary import format_table, summarise
from rl.argtypes import non_negative_int, positive_int
from rl.errors import RlError

RUNNERS = {"ours": "peers.bench_ours", "trl": "peers.trl_loop"}
"""Each side's runner module, run as `python -m MODULE --shape S --iterations N --seed K`."""

CHILD_ENV = {
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "HF_HUB_OFFLINE": "1",
    "TRL_EXPERIMENTAL_SILENCE": "1",
}
"""One thread everywhere on both sides (each runner also calls `torch.set_num_threads(1)`), and nothing online."""


class BenchRunError(RlError):
    """A runner process failed or printed no record; the message holds its stderr's end and the command to rerun."""


def _shapes(text: str) -> list[str]:
    names = [s.strip() for s in text.split(",") if s.strip()]
    unknown = [s for s in names if s not in SHAPES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"{text!r}: unknown or no shape(s) {unknown}; choose a comma-separated list from {', '.join(SHAPES)}"
        )
    return list(dict.fromkeys(names))


def default_warmup(iterations: int) -> int:
    """Start-up iterations left out of the steady-state figures: a fifth of the run, at least 1 and at most 5, and
    always leaving one iteration in."""
    return min(iterations - 1, max(1, min(5, iterations // 5)))


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m peers.bench_trl",
        description="our CPU GRPO loop and TRL's GRPOTrainer, same model, prompts, reward and shape, side by side",
    )
    p.add_argument("--seeds", type=positive_int, default=3, help="seeds per shape, 0..N-1 (default 3)")
    p.add_argument(
        "--iterations",
        type=positive_int,
        default=None,
        help="iterations per run, every shape (default: "
        + ", ".join(f"{k} {v.default_iterations}" for k, v in SHAPES.items())
        + ")",
    )
    p.add_argument(
        "--shapes",
        type=_shapes,
        default=DEFAULT_SHAPES,
        help=f"comma-separated, from {', '.join(SHAPES)} (default {','.join(DEFAULT_SHAPES)})",
    )
    p.add_argument(
        "--warmup",
        type=non_negative_int,
        default=None,
        help="start-up iterations excluded from the steady-state figures (default: a fifth, 1 to 5)",
    )
    p.add_argument("--json", action="store_true", help="end with one JSON line: every record and every table row")
    args = p.parse_args(argv)
    for shape in args.shapes:
        iterations = args.iterations or SHAPES[shape].default_iterations
        if args.warmup is not None and args.warmup >= iterations:
            p.error(
                f"--warmup {args.warmup} leaves no steady-state iteration of shape {shape}'s {iterations}; "
                "lower --warmup or raise --iterations"
            )
    return args


def run_one(impl: str, shape: str, iterations: int, seed: int) -> RunRecord:
    """One runner in its own process; its record, or `BenchRunError` saying how it failed."""
    cmd = [sys.executable, "-m", RUNNERS[impl], "--shape", shape, "--iterations", str(iterations), "--seed", str(seed)]
    root = str(Path(__file__).resolve().parent.parent)  # where `peers` imports from, whatever the working directory
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, **CHILD_ENV, "PYTHONPATH": path}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise BenchRunError(
            f"{impl} on shape {shape}, seed {seed} exited {done.returncode} without a record; its stderr ends:\n"
            f"{done.stderr[-3000:]}\nrerun it alone: PYTHONPATH={root} {' '.join(cmd)}"
        )
    return RunRecord.from_json(lines[-1])


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    records: list[RunRecord] = []
    tables = {}
    try:
        for shape in args.shapes:
            iterations = args.iterations or SHAPES[shape].default_iterations
            warmup = args.warmup if args.warmup is not None else default_warmup(iterations)
            shape_records = []
            for seed in range(args.seeds):
                for impl in RUNNERS:
                    t0 = time.perf_counter()
                    record = run_one(impl, shape, iterations, seed)
                    took = time.perf_counter() - t0
                    print(f"{impl} {shape} seed {seed}: {iterations} iterations, {took:.1f} s", file=sys.stderr)
                    shape_records.append(record)
            rows = summarise(shape_records, warmup)[shape]
            tables[shape] = {"iterations": iterations, "warmup": warmup, "rows": rows}
            records.extend(shape_records)
            print(format_table(shape, rows, seeds=args.seeds, iterations=iterations, warmup=warmup), end="\n\n")
    except RlError as e:
        print(f"bench-peers: {e}", file=sys.stderr)
        return e.exit_code
    print(f"bench-peers: {len(records)} runs in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    if args.json:
        summary = {
            shape: {
                "iterations": t["iterations"],
                "warmup": t["warmup"],
                "figures": {r.label: {"ours": r.ours.median, "trl": r.trl.median, "ratio": r.ratio} for r in t["rows"]},
            }
            for shape, t in tables.items()
        }
        print(json.dumps({"shapes": summary, "records": [json.loads(r.to_json()) for r in records]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
