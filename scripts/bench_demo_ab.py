"""Our loop at another commit, our loop here and TRL on the demo shape, interleaved seed by seed (docs/benchmarks.md).

    git worktree add /tmp/old <commit>
    .nox/bench-peers/bin/python scripts/bench_demo_ab.py /tmp/old --seeds 3

Each side runs `peers.bench_ours` (or `peers.trl_loop`) in a fresh one-thread process from its own checkout; prints
each run's steady-state wall s/iter (median) and CPU s/iter (mean), first 5 iterations excluded, then the medians
over seeds and each side over TRL.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(HERE))  # peers/ is beside rl/, not installed

from peers.bench_trl import CHILD_ENV  # noqa: E402


def run(root: Path, module: str, seed: int) -> tuple[float, float]:
    cmd = [sys.executable, "-m", module, "--shape", "demo", "--iterations", "120", "--seed", str(seed)]
    env = {**os.environ, **CHILD_ENV, "PYTHONPATH": str(root)}
    done = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        sys.exit(f"{' '.join(cmd)} in {root} failed:\n{done.stderr[-3000:]}")
    record = json.loads(lines[-1])
    return statistics.median(record["wall_s"][5:]), statistics.mean(record["cpu_s"][5:])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("other", type=Path, help="a checkout of the other commit (git worktree add DIR COMMIT)")
    p.add_argument("--seeds", type=int, default=3)
    args = p.parse_args()
    sides = {"ours-other": (args.other.resolve(), "peers.bench_ours"), "ours-here": (HERE, "peers.bench_ours")}
    sides["trl"] = (HERE, "peers.trl_loop")
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in sides}
    for seed in range(args.seeds):
        for name, (root, module) in sides.items():
            wall, cpu = run(root, module, seed)
            results[name].append((wall, cpu))
            print(f"{name} seed {seed}: wall {wall:.4f} cpu {cpu:.4f}", flush=True)
    medians = {name: tuple(statistics.median(r[i] for r in rows) for i in (0, 1)) for name, rows in results.items()}
    for name, (wall, cpu) in medians.items():
        trl_wall, trl_cpu = medians["trl"]
        over = f"; over TRL {wall / trl_wall:.2f} wall, {cpu / trl_cpu:.2f} CPU" if name != "trl" else ""
        print(f"{name}: wall {wall:.4f} s/iter, CPU {cpu:.4f} s/iter{over}")


if __name__ == "__main__":
    main()
