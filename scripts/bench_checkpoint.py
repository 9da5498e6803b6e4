"""The driver's checkpoint writes over a growing history: `CheckpointEncoder` beside another format module's encoder.

    git show d4cbf8f:rl/storage/checkpoint/format.py > /tmp/old_format.py
    .nox/unit/bin/python scripts/bench_checkpoint.py --old /tmp/old_format.py --iterations 1000 --repeats 4

A run of `--iterations` states, each one row longer (an eval row every tenth), encoded in order as the driver writes
them; the two encoders interleaved, each repeat alternating which goes first; medians over repeats. The bytes must be
the same.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import replace

from rl.storage.checkpoint import format as fmt
from rl.types import ArtifactRef, EvalResult, IterationMetrics


def states(n: int) -> Iterator[fmt.DriverState]:
    ref = ArtifactRef(uri="file:///run/artifacts/adapter-0001", digest="d" * 32)
    state = replace(fmt.DriverState.initial("c" * 32, ref, ref), config={"iterations": n, "lr": 1e-4, "seed": 0})
    for i in range(n):
        row = IterationMetrics(
            i, i + 1, 64, 0.5, 1.0, 0.01 * i, 60, "What is 3+4?", "The answer is 7.", 1.0, extra={"lr": 1e-4},
            num_groups=8, kl=0.001, grad_norm=0.3, task_metrics={"accuracy": 0.5, "format_rate": 0.9},
            phase_s={"generate": 0.12, "score": 0.01, "train": 0.3},
        )  # fmt: skip
        evals = [*state.evals, EvalResult(i, 4, 0.5, 0.25, 8)] if i % 10 == 0 else state.evals
        state = replace(state, iteration=i, policy_version=i + 1, history=[*state.history, row], evals=evals)
        yield state


def timed(encode: Callable[[fmt.DriverState], bytes], run: list[fmt.DriverState]) -> tuple[list[float], bytes]:
    seconds, blob = [], b""
    for state in run:
        started = time.perf_counter()
        blob = encode(state)
        seconds.append(time.perf_counter() - started)
    return seconds, blob


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", required=True, help="a format.py to compare with (git show REV:rl/storage/...)")
    parser.add_argument("--iterations", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=4)
    args = parser.parse_args()
    spec = importlib.util.spec_from_file_location("old_format", args.old)
    assert spec is not None and spec.loader is not None
    old = importlib.util.module_from_spec(spec)
    sys.modules["old_format"] = old
    spec.loader.exec_module(old)
    run = list(states(args.iterations))
    encoders = {"old": lambda: old.encode_state, "new": lambda: fmt.CheckpointEncoder().encode}
    found: dict[str, list[tuple[float, float, float]]] = {"old": [], "new": []}
    blobs = set()
    for repeat in range(args.repeats):
        for name in ("old", "new") if repeat % 2 == 0 else ("new", "old"):
            getattr(old, "_ROW_TEXTS", {}).clear()  # the old encoder's row cache, so each repeat starts cold
            seconds, blob = timed(encoders[name](), run)
            blobs.add(blob)
            found[name].append((sum(seconds), statistics.mean(seconds[:100]), statistics.mean(seconds[-100:])))
    assert len(blobs) == 1, "the two encoders wrote different bytes"
    for name, rows in found.items():
        total, first, last = (statistics.median(r[k] for r in rows) for k in range(3))
        each = f"{first * 1e6:.0f} us (first 100), {last * 1e6:.0f} us (last 100)"
        print(f"{name}: {total * 1e3:.0f} ms in all; a checkpoint: {each}")
    ratios = sorted(n[0] / o[0] for n, o in zip(found["new"], found["old"], strict=True))
    print(f"new/old in all, each repeat: {', '.join(f'{r:.2f}' for r in ratios)}; {len(blobs.pop())} bytes at the end")


if __name__ == "__main__":
    main()
