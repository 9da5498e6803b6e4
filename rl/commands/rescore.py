"""`rl rescore RUN_DIR --reward NAME`: re-score every stored rollout of a run with another reward, generating nothing.

Reads the head of the run's rollout buffer (RUN_DIR/volumes), writes the re-scored rows into a new buffer version
(the old one is untouched), and reports means before and after.
"""

from __future__ import annotations

import argparse
import json

from rl.commands import user_path


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "rescore", help="re-score a run's stored rollouts with another reward, without generating"
    )
    p.add_argument("run_dir", type=user_path, help="a run directory written by `rl demo grpo` (holds volumes/)")
    p.add_argument("--reward", required=True, help="a reward name from rl.rewards.REWARDS (default, format, ...)")
    p.add_argument("--json", action="store_true", help="end with one JSON object of the results")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rl.errors import InputError
    from rl.rewards import get_reward
    from rl.types import Rollout
    from rl.volumes.buffer import RolloutBuffer
    from rl.volumes.local import LocalVolumeStore
    from rl.volumes.sink import BUFFER_NAME

    reward = get_reward(args.reward)  # an unknown name is refused before anything is read
    volumes = args.run_dir / "volumes"
    if not volumes.is_dir():
        raise InputError(
            f"{args.run_dir} has no rollout buffer (no volumes/ directory); run `rl demo grpo --out "
            f"{args.run_dir}` with the buffer on (the default) first"
        )
    buffer = RolloutBuffer(LocalVolumeStore(volumes), BUFFER_NAME)
    head = buffer.head()
    if head is None:
        raise InputError(
            f"the rollout buffer in {volumes} has no version yet; run `rl demo grpo --out {args.run_dir}` first"
        )

    def rescored(rollout: Rollout) -> float:
        return reward(rollout.completion, rollout.answer)

    new, stats = buffer.rescore(head, rescored, reward_name=args.reward)
    summary = stats.to_dict()
    print(
        f"re-scored {stats.rollouts_rescored} rollouts from {len(stats.iterations)} iterations with {args.reward!r}: "
        f"mean reward {stats.mean_reward_before:.4f} -> {stats.mean_reward_after:.4f}; generated {stats.generated}; "
        f"new buffer version {new.version[:12]} (parent {head.version[:12]} unchanged)"
    )
    if args.json:
        print(json.dumps(summary))
    return 0
