"""The demo's learning across seeds and CPU kernel paths: `rl demo grpo`'s default run (tiny model, torch sampler,
120 iterations of 8 prompts x 8 samples) on each seed under each `ATEN_CPU_CAPABILITY`, and its held-out avg@8
(docs/benchmarks.md, "The demo's learning over seeds and kernels").

    python scripts/demo_learning.py                              # seeds 0-19, every kernel path this CPU has
    python scripts/demo_learning.py --seeds 0-3 --kernels avx2 --jobs 2

Each kernel path runs in processes of its own (torch reads the variable once, at import); the run directories go to a
temporary directory that is removed at the end. Prints one line per run, then min, median and max per kernel path,
and exits 1 when a run is below `--floor` or a median below `--median-floor`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

KERNELS = ("default", "avx2", "avx512")


def available_kernels() -> list[str]:
    """The kernel paths this CPU can run: `default` always, `avx2` and `avx512` where /proc/cpuinfo lists them."""
    try:
        flags = set(Path("/proc/cpuinfo").read_text().split())
    except OSError:
        return ["default"]
    return ["default"] + [k for k, flag in (("avx2", "avx2"), ("avx512", "avx512f")) if flag in flags]


def parse_seeds(text: str) -> list[int]:
    """`0-19` or `0,3,7`."""
    if "-" in text:
        first, last = text.split("-", 1)
        return list(range(int(first), int(last) + 1))
    return [int(s) for s in text.split(",")]


def worker(seeds: list[int], root: Path) -> None:
    """Run the demo on each seed in this process and print one JSON line each."""
    from rich.console import Console

    from rl.deploy.demo import grpo_demo_config, run_demo
    from rl.storage.run_dir import open_run

    for seed in seeds:
        config = grpo_demo_config(iterations=120, seed=seed)
        console = Console(file=open(os.devnull, "w"))  # noqa: SIM115  (the progress bar goes nowhere)
        with open_run(root / f"seed{seed}", command="scripts/demo_learning.py") as run:
            summary = asyncio.run(run_demo(config, run, console=console))
        print(
            json.dumps(
                {
                    "seed": seed,
                    "kernel": os.environ.get("ATEN_CPU_CAPABILITY", "default"),
                    "heldout": summary["heldout_avg_at_k_last"],
                    "train_last": summary["accuracy_last"],
                }
            ),
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0-19")
    parser.add_argument("--kernels", default=",".join(available_kernels()))
    parser.add_argument("--jobs", type=int, default=2, help="processes at once (each runs on one torch thread)")
    parser.add_argument("--floor", type=float, default=0.6, help="the least held-out avg@8 any run may end at")
    parser.add_argument("--median-floor", type=float, default=0.8)
    parser.add_argument("--json", action="store_true", help="end with one JSON line: every run and each path's figures")
    parser.add_argument("--keep", type=Path, default=None, help="keep the run directories under this new directory")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--root", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    seeds = parse_seeds(args.seeds)
    if args.worker:
        worker(seeds, args.root)
        return
    kernels = args.kernels.split(",")
    unknown = [k for k in kernels if k not in KERNELS]
    if unknown:
        parser.error(f"--kernels {','.join(unknown)}: choose from {', '.join(KERNELS)}")
    results: dict[str, list[float]] = {k: [] for k in kernels}
    rows: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory(prefix="rl-demo-learning-") as scratch:
        tmp = args.keep if args.keep is not None else Path(scratch)
        jobs = [(k, seeds[i :: args.jobs]) for k in kernels for i in range(args.jobs) if seeds[i :: args.jobs]]
        running: list[subprocess.Popen[str]] = []
        for n, (kernel, part) in enumerate(jobs):
            root = Path(tmp) / f"{kernel}-{n}"
            root.mkdir(parents=True)
            env = {**os.environ, "ATEN_CPU_CAPABILITY": kernel, "HF_HUB_OFFLINE": "1"}
            command = [sys.executable, __file__, "--worker", "--root", str(root), "--seeds", ",".join(map(str, part))]
            running.append(subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True))
            if len(running) == args.jobs or n == len(jobs) - 1:
                for process in running:
                    assert process.stdout is not None
                    for line in process.stdout:
                        row = json.loads(line)
                        results[row["kernel"]].append(row["heldout"])
                        rows.append(row)
                        print(
                            f"{row['kernel']:8} seed {row['seed']:3}: held-out avg@8 {row['heldout']:.3f} "
                            f"(train, last 12: {row['train_last']:.3f})",
                            flush=True,
                        )
                    if process.wait() != 0:
                        sys.exit(f"the {kernel} worker failed (exit {process.returncode})")
                running = []
    failed = False
    figures: dict[str, dict[str, float]] = {}
    print(f"\n{'kernel':8} {'runs':>4} {'min':>6} {'median':>6} {'max':>6}  below {args.floor}")
    for kernel, values in results.items():
        below = sum(v < args.floor for v in values)
        median = statistics.median(values)
        failed |= below > 0 or median < args.median_floor
        figures[kernel] = {"min": min(values), "median": median, "max": max(values), "below_floor": below}
        print(f"{kernel:8} {len(values):4} {min(values):6.3f} {median:6.3f} {max(values):6.3f}  {below}")
    if args.json:
        print(json.dumps({"runs": rows, "kernels": figures}))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
