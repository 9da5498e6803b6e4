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
from typing import TYPE_CHECKING

from rl.argtypes import user_path

if TYPE_CHECKING:
    from rl.storage.run_dir import RunDir


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

    from rl.errors import IncompleteBufferError, InputError, shown
    from rl.rewards import get_reward
    from rl.storage.run_dir import open_existing_run
    from rl.storage.run_layout import RunLayout
    from rl.storage.volumes.buffer import VolumeBuffer
    from rl.storage.volumes.rollout_buffer import BUFFER_NAME
    from rl.storage.volumes.store import LocalVolumeStore
    from rl.types import Rollout

    reward = get_reward(args.reward)  # an unknown name is refused before anything is read

    def has_buffer(layout: RunLayout) -> None:
        if not layout.volumes.is_dir():
            raise InputError(
                f"{layout.root} has no rollout buffer (no volumes/ directory); run `rl demo grpo --out "
                f"{layout.root}` with the buffer on (the default) first"
            )

    # Checked once (no entry a link: volumes/ must not lead elsewhere), then locked: a writer (a resuming `rl demo
    # grpo`, another rescore) would move the head and the checkpoint under us.
    with open_existing_run(args.run_dir, command="rl rescore", require=has_buffer) as run:
        volumes = run.layout.volumes
        buffer = VolumeBuffer(LocalVolumeStore(volumes), BUFFER_NAME)
        head = buffer.head()
        if head is None:
            raise InputError(
                f"the rollout buffer in {volumes} has no version yet; run `rl demo grpo --out {args.run_dir}` first"
            )
        held = buffer.iterations(head)
        through, source = _trained_through(run, held)
        spans = missing_ranges(held, through)  # as ranges: a claimed iteration of 10**12 costs nothing
        count = sum(b - a + 1 for a, b in spans)
        if spans:
            gap = (
                f"the rollout buffer in {shown(volumes)} misses iteration(s) {shown(iteration_ranges(spans))} "
                f"of the run's 0..{through} ({source}), so its means are not the run's"
            )
            if not args.allow_gaps or count > MAX_LISTED_MISSING:
                why = (
                    f"pass --allow-gaps to re-score the {len(held)} iteration(s) it holds anyway"
                    if count <= MAX_LISTED_MISSING
                    else f"more than {MAX_LISTED_MISSING} missing is not a run this tool wrote: check {shown(volumes)} "
                    "and the checkpoint"
                )
                raise IncompleteBufferError(f"{gap}; {why}")
            print(f"rl rescore: WARNING: {gap}; re-scoring the {len(held)} it holds (--allow-gaps)", file=sys.stderr)
        missing = [it for a, b in spans for it in range(a, b + 1)]  # at most MAX_LISTED_MISSING

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


def _trained_through(run: RunDir, held: list[int]) -> tuple[int, str]:
    """The last iteration the run trained, and where that figure comes from (for the message)."""
    import sys

    from rl.errors import CheckpointCorruptError, CheckpointError, shown
    from rl.storage.checkpoint.file_store import MAX_CHECKPOINT_BYTES
    from rl.storage.checkpoint.format import decode_state
    from rl.storage.safe_fs import Tree

    path = run.layout.checkpoint
    fs = Tree(run.root)
    if fs.kind(path) == "file":
        try:
            try:
                blob = fs.read_bytes(path, limit=MAX_CHECKPOINT_BYTES)
            except OverflowError:
                raise CheckpointCorruptError(f"larger than {MAX_CHECKPOINT_BYTES} bytes") from None
            state = decode_state(blob, str(path))
        except CheckpointError as exc:
            print(
                f"rl rescore: WARNING: {shown(path)} is unreadable ({shown(exc, 400)}); checking the buffer for gaps "
                "up to its own last iteration only",
                file=sys.stderr,
            )
        else:
            return state.iteration, f"its checkpoint is at iteration {state.iteration}"
    return max(held), f"no readable checkpoint: the buffer's last iteration is {max(held)}"


MAX_LISTED_MISSING = 100_000  # missing iterations `--allow-gaps` lists one by one (in `--json`)


def missing_ranges(held: list[int], through: int) -> list[tuple[int, int]]:
    """The iterations in 0..through that `held` lacks, as (first, last) spans: as many as `held` has entries, plus
    one, whatever `through` or the held iterations claim."""
    spans, nxt = [], 0
    for it in sorted(set(held)):
        if it > through:
            break
        if it > nxt:
            spans.append((nxt, it - 1))
        nxt = max(nxt, it + 1)
    if nxt <= through:
        spans.append((nxt, through))
    return spans


def iteration_ranges(spans: list[tuple[int, int]]) -> str:
    """`0, 3..7, 9` for [(0, 0), (3, 7), (9, 9)]: a long gap stays one short line."""
    return ", ".join(str(a) if a == b else f"{a}..{b}" for a, b in spans)
