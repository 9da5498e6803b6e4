"""`rl rescore RUN_DIR --reward NAME`: re-score every stored rollout of a run with another reward, generating nothing.

Reads the head of the run's rollout buffer (RUN_DIR/volumes), writes the re-scored rows into a new buffer version
(the old one is untouched), and reports means before and after.

A buffer that misses iterations the run trained (a run resumed with the buffer switched off or on, before resumes
refused that) is refused: means over another set of rollouts than the run's would be compared without a word. The
iterations the run trained are 0..N, N the last one in RUN_DIR/checkpoint.json (or the buffer's last, without one).
`--allow-gaps` re-scores what is there, with a warning that lists the missing iterations.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rl.argtypes import user_path


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "rescore", help="re-score a run's stored rollouts with another reward, without generating"
    )
    p.add_argument("run_dir", type=user_path, help="a run directory written by `rl demo grpo` (holds volumes/)")
    p.add_argument("--reward", required=True, help="a reward name from rl.rewards.REWARDS (default, format, ...)")
    p.add_argument(
        "--allow-gaps",
        action="store_true",
        help="re-score a buffer that misses iterations the run trained (refused by default), with a warning",
    )
    p.add_argument("--json", action="store_true", help="end with one JSON object of the results")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import sys

    from rl.errors import IncompleteBufferError, InputError
    from rl.rewards import get_reward
    from rl.run_layout import RunLayout, require_safe
    from rl.run_lock import run_lock
    from rl.types import Rollout
    from rl.volumes.buffer import RolloutBuffer
    from rl.volumes.sink import BUFFER_NAME
    from rl.volumes.store import LocalVolumeStore

    reward = get_reward(args.reward)  # an unknown name is refused before anything is read
    require_safe(args.run_dir)  # a run directory someone sent: volumes/ must not lead elsewhere
    volumes = RunLayout(args.run_dir).volumes
    if not volumes.is_dir():
        raise InputError(
            f"{args.run_dir} has no rollout buffer (no volumes/ directory); run `rl demo grpo --out "
            f"{args.run_dir}` with the buffer on (the default) first"
        )
    # A writer (a resuming `rl demo grpo`, another rescore) would move the head and the checkpoint under us.
    with run_lock(args.run_dir, command="rl rescore"):
        buffer = RolloutBuffer(LocalVolumeStore(volumes), BUFFER_NAME)
        head = buffer.head()
        if head is None:
            raise InputError(
                f"the rollout buffer in {volumes} has no version yet; run `rl demo grpo --out {args.run_dir}` first"
            )
        held = buffer.iterations(head)
        through, source = _trained_through(args.run_dir, held)
        missing = missing_iterations(held, through)
        if missing:
            gap = (
                f"the rollout buffer in {volumes} misses iteration(s) {iteration_ranges(missing)} of the run's "
                f"0..{through} ({source}), so its means are not the run's"
            )
            if not args.allow_gaps:
                raise IncompleteBufferError(
                    f"{gap}; pass --allow-gaps to re-score the {len(held)} iteration(s) it holds anyway"
                )
            print(f"rl rescore: WARNING: {gap}; re-scoring the {len(held)} it holds (--allow-gaps)", file=sys.stderr)

        def rescored(rollout: Rollout) -> float:
            return reward(rollout.completion, rollout.answer)

        new, stats = buffer.rescore(head, rescored, reward_name=args.reward)
    summary = {**stats.to_dict(), "missing_iterations": missing}
    print(
        f"re-scored {stats.rollouts_rescored} rollouts from {len(stats.iterations)} iterations with {args.reward!r}: "
        f"mean reward {stats.mean_reward_before:.4f} -> {stats.mean_reward_after:.4f}; generated {stats.generated}; "
        f"new buffer version {new.version[:12]} (parent {head.version[:12]} unchanged)"
    )
    if args.json:
        print(json.dumps(summary, allow_nan=False))
    return 0


def _trained_through(run_dir: Path, held: list[int]) -> tuple[int, str]:
    """The last iteration the run trained, and where that figure comes from (for the message)."""
    import sys

    from rl.checkpoint.file_store import MAX_CHECKPOINT_BYTES
    from rl.checkpoint.format import decode_state
    from rl.errors import CheckpointCorruptError, CheckpointError
    from rl.run_layout import RunLayout
    from rl.safe_fs import Tree

    path = RunLayout(run_dir).checkpoint
    fs = Tree(run_dir)
    if fs.kind(path) == "file":
        try:
            try:
                blob = fs.read_bytes(path, limit=MAX_CHECKPOINT_BYTES)
            except OverflowError:
                raise CheckpointCorruptError(f"larger than {MAX_CHECKPOINT_BYTES} bytes") from None
            state = decode_state(blob, str(path))
        except CheckpointError as exc:
            print(
                f"rl rescore: WARNING: {path} is unreadable ({exc}); checking the buffer for gaps up to its own last "
                "iteration only",
                file=sys.stderr,
            )
        else:
            return state.iteration, f"its checkpoint is at iteration {state.iteration}"
    return max(held), f"no readable checkpoint: the buffer's last iteration is {max(held)}"


def missing_iterations(held: list[int], through: int) -> list[int]:
    """The iterations in 0..through that `held` lacks."""
    have = set(held)
    return [it for it in range(through + 1) if it not in have]


def iteration_ranges(iterations: list[int]) -> str:
    """`0, 3..7, 9` for [0, 3, 4, 5, 6, 7, 9]: a long gap stays one short line."""
    spans: list[list[int]] = []
    for it in sorted(iterations):
        if spans and it == spans[-1][1] + 1:
            spans[-1][1] = it
        else:
            spans.append([it, it])
    return ", ".join(str(a) if a == b else f"{a}..{b}" for a, b in spans)
