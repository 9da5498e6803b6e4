"""`python -m rl.deploy.flyte.agentic_cli run [--local] [...]`: run the agentic driver; `fork` re-scores a finished
run."""

from __future__ import annotations

import argparse

import flyte

from rl.deploy.flyte.agentic import SMOKE, STRESS, fork, train
from rl.deploy.flyte.agentic_faults import AgenticFaultSpec, train_with_faults
from rl.types import Rubric


def main(argv: list[str] | None = None) -> int:
    """`python -m rl.deploy.flyte.agentic_cli run [--local] [...]`, or `... fork RUN --rubric-name v2 [...]` on a
    cluster.

    A fault flag runs `train_with_faults` (the tutorial's failure-injected run) instead of `train`.
    """
    parser = argparse.ArgumentParser(prog="python -m rl.deploy.flyte.agentic_cli", description=main.__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    run_cmd = commands.add_parser("run", help="run the loop")
    run_cmd.add_argument("--local", action="store_true", help="Flyte's local mode in this process")
    run_cmd.add_argument("--stress", action="store_true", help="the stress shape (10 steps x 16 prompts x 4 samples)")
    run_cmd.add_argument("--crash-driver-at-step", type=int, default=-1)
    run_cmd.add_argument("--flaky-trial-rate", type=float, default=0.0)
    run_cmd.add_argument("--judge-flake-rate", type=float, default=0.0)
    fork_cmd = commands.add_parser("fork", help="re-score a finished run with a new rubric (cluster only)")
    fork_cmd.add_argument("run_name")
    fork_cmd.add_argument("--rubric-name", default="v2-efficiency")
    fork_cmd.add_argument("--correctness-weight", type=float, default=1.0)
    fork_cmd.add_argument("--efficiency-weight", type=float, default=1.0)
    fork_cmd.add_argument("--tidiness-weight", type=float, default=0.5)
    args = parser.parse_args(argv)
    if args.command == "fork":
        flyte.init_from_config()
        rubric = Rubric(
            correctness_weight=args.correctness_weight,
            efficiency_weight=args.efficiency_weight,
            tidiness_weight=args.tidiness_weight,
            name=args.rubric_name,
        )
        print(fork(args.run_name, rubric).url)
        return 0
    faults = AgenticFaultSpec(
        flaky_trial_rate=args.flaky_trial_rate,
        judge_flake_rate=args.judge_flake_rate,
        crash_driver_at_step=args.crash_driver_at_step,
    )
    config = STRESS if args.stress else SMOKE
    task, inputs = (
        (train, {"config": config})
        if faults == AgenticFaultSpec()
        else (train_with_faults, {"config": config, "faults": faults})
    )
    if args.local:
        run = flyte.with_runcontext(mode="local").run(task, **inputs)
    else:
        flyte.init_from_config()
        run = flyte.run(task, **inputs)
    print(run.url)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
