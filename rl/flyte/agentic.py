"""Seed 002's durable agentic loop as Flyte tasks: thin recipes over `rl.agentic` and `rl.loop.agentic.train`.

Tasks (environments in `rl.flyte.envs`):

- `build_world` (sandbox tier, cached): a world's files sealed once per (world, seed); every trial forks it.
- `generate` (sandbox tier, `retries=1`, `Timeout(max_runtime=300 s)`): one trial in a private copy of its world
  (`rl.agentic.tiers.SandboxTier`); idempotent by construction, so a retry regenerates the same trajectory.
- `verify_and_judge` (judge tier, `retries=2`): the verifier plus `call_judge`, which is `@flyte.trace`d so a retry
  after the judge answered replays the recorded score instead of billing the judge again.
- `setup_trainer` / `train_step` (trainer tier, `retries=1`, `Timeout(max_runtime=600 s)`): the bandit update as a pure
  step, weights in and weights out, so a re-executed step recomputes the same weights (exactly once by purity).
- `train` (driver, `report=True`): `rl.loop.agentic.train` over `FlyteAgenticTiers`, one `flyte.group` per step.
- `fork(run_name, rubric)`: `flyte.rerun(run_name, recover=True, rubric=rubric)` — re-score a finished run.

Open-source substitutes for Union features, each the seed's OSS counterpart: worlds are `flyte.io.Dir`s that each trial
copies (`DirWorlds`) instead of copy-on-write volumes; the trainer is a pure task instead of a detached Ray actor on a
reusable cluster (`rl.agentic.ray_trainer` is that actor, for a Union deployment with KubeRay).

What Flyte's local mode cannot show — driver replay after a crash, the trace memo across retries, `flyte.rerun`,
enforced timeouts, attempt-0-only fault injection — is listed in every result's `remote_only` and in the report; the
simulator (`rl.sim.agentic_sim`, `rl demo agentic`) proves those behaviours instead.
"""

from __future__ import annotations

import argparse
import html
import math
import os
import shutil
import tempfile
from collections import Counter
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

import flyte
import flyte.report
from flyte.io import Dir
from pydantic import BaseModel, ConfigDict, model_validator

from rl.agentic.bandit import bandit_update, initial_weights, step_result
from rl.agentic.judge import judge_score
from rl.agentic.tiers import JudgeTier, SandboxTier
from rl.agentic.types import Reward, Rubric, StepResult, Trajectory, TrialSpec, Weights, WorldRef
from rl.agentic.worlds import Workspace
from rl.artifacts import compute_digest, read_dir
from rl.flyte.bindings import attempt_number, is_local, task_context
from rl.flyte.envs import agentic_driver_env, agentic_trainer_env, judge_env, sandbox_env
from rl.flyte.strict import ConfigError, StrictConfig
from rl.loop.agentic import AgenticOutcome, SkippedTrial
from rl.loop.agentic import train as train_loop

__all__ = [
    "AgenticRunConfig",
    "AgenticRunResult",
    "DirWorlds",
    "FlyteAgenticTiers",
    "agentic_driver_env",
    "build_world",
    "call_judge",
    "fork",
    "generate",
    "setup_trainer",
    "train",
    "train_step",
    "verify_and_judge",
]

GENERATE_TIMEOUT_S = 300.0
GENERATE_TIMEOUT = flyte.Timeout(max_runtime=timedelta(seconds=GENERATE_TIMEOUT_S))
TRAIN_TIMEOUT = flyte.Timeout(max_runtime=timedelta(seconds=600))

REMOTE_ONLY = (
    "driver replay: a retried driver replays completed actions from the durable record (local mode re-runs the "
    "driver body, and crash_driver_at_step is refused because local mode never sets FLYTE_ATTEMPT_NUMBER)",
    "trace memo: @flyte.trace replays call_judge on a retried verify_and_judge (local mode calls the judge again)",
    "attempt-0-only faults: flaky_trial_rate and judge_flake_rate fire on attempt 0 only (local mode reports every "
    "attempt as 0, so an injected fault repeats on each retry and the trial is skipped)",
    "rerun: fork(run, rubric) forks a finished run with flyte.rerun(recover=True) (local mode raises; re-score locally "
    "by running train again with the new rubric, and the cache reuses the worlds and unchanged rollouts)",
    "timeouts: flyte.Timeout bounds generate and train_step (local mode does not enforce them)",
)


class RemoteOnlyError(RuntimeError):
    """A feature that Flyte's local mode does not provide was asked for in local mode."""


MAX_WORLDS = 1024  # each world is a cached task and a sealed Dir; more than this is a typo, not a run


class AgenticRunConfig(StrictConfig):
    """The run's shape (seed 002's defaults: 3 steps x 3 prompts x 2 samples over 3 worlds) and its tool latency.

    Checked when built (from Python or `--config` JSON): unknown keys, counts below 1, more worlds than prompts per
    step (prompt p explores world p mod W, so the rest would never be explored), a learning rate that is not a
    finite positive number, and a tool latency whose `max_turns` calls alone outlast `generate`'s timeout."""

    n_steps: int = 3
    n_worlds: int = 3
    prompts_per_step: int = 3
    n_samples: int = 2
    seed: int = 0
    lr: float = 2.0
    max_turns: int = 6
    tool_latency_s: float = 0.2

    @model_validator(mode="after")
    def _check(self) -> AgenticRunConfig:
        counts = {name: getattr(self, name) for name in ("n_steps", "n_worlds", "prompts_per_step", "n_samples")}
        for name, value in {**counts, "max_turns": self.max_turns}.items():
            if value < 1:
                raise ConfigError(f"{name} must be >= 1, got {value}")
        if self.n_worlds > min(self.prompts_per_step, MAX_WORLDS):
            raise ConfigError(
                f"n_worlds {self.n_worlds} is more than the {self.prompts_per_step} prompts per step explore (prompt p "
                f"explores world p mod n_worlds; at most {MAX_WORLDS}): lower n_worlds or raise prompts_per_step"
            )
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise ConfigError(f"lr must be a finite number > 0, got {self.lr}")
        budget_s = GENERATE_TIMEOUT_S
        if not (math.isfinite(self.tool_latency_s) and 0 <= self.tool_latency_s * self.max_turns < budget_s):
            raise ConfigError(
                f"tool_latency_s must be >= 0 with max_turns x tool_latency_s under generate's {budget_s:g} s "
                f"timeout, got {self.tool_latency_s} x {self.max_turns} turns"
            )
        return self

    def check_inputs(self, crash_driver_at_step: int, flaky_trial_rate: float, judge_flake_rate: float) -> None:
        """Refuse `train`'s other inputs that cannot work with this config, before any task starts."""
        if not -1 <= crash_driver_at_step < self.n_steps:
            raise ConfigError(
                f"crash_driver_at_step {crash_driver_at_step} is beyond the run's {self.n_steps} steps "
                f"(0..{self.n_steps - 1}); pick one of those, or -1 for no crash"
            )
        for name, rate in (("flaky_trial_rate", flaky_trial_rate), ("judge_flake_rate", judge_flake_rate)):
            if not 0.0 <= rate <= 1.0:
                raise ConfigError(f"{name} must be a probability in [0, 1], got {rate}")


SMOKE = AgenticRunConfig()
STRESS = AgenticRunConfig(n_steps=10, n_worlds=8, prompts_per_step=16, n_samples=4)
DEFAULT_RUBRIC = Rubric()


class AgenticRunResult(BaseModel):
    """The driver's output: the loop's outcome, whether it ran in local mode, and what that mode could not show."""

    model_config = ConfigDict(frozen=True)

    history: list[StepResult]
    skipped: list[SkippedTrial]
    driver_attempt: int
    local_mode: bool
    remote_only: list[str]


# ---------------------------------------------------------------------------------------------------------- worlds


class _DirWorkspace:
    """A trial's private copy of a world: a local directory; `finalize` stages it for upload as the trial's world."""

    def __init__(self, store: DirWorlds, root: Path, name: str) -> None:
        self.store, self.root, self._name = store, root, name

    @property
    def name(self) -> str:
        return self._name

    def read_text(self, relpath: str) -> str:
        return (self.root / relpath).read_text()

    def write_text(self, relpath: str, text: str) -> None:
        path = self.root / relpath
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)

    def finalize(self, message: str) -> str:
        return self.store.stage(self.root, self._name)

    def abandon(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


class DirWorlds:
    """`WorldStore` on `flyte.io.Dir` (open-source Flyte): a version is a Dir's path; a fork is a private local copy.

    Slower per trial than a copy-on-write volume fork for a large world, with the same isolation: the trial writes
    into its own copy, and a sealed version never changes.

    Flyte's I/O is async and a task body may not block on it, while `WorldStore` is synchronous. So the store works
    in two phases around the synchronous calls: `await prefetch(version)` downloads a version before `fork`/`read`
    use it, and `seal`/`finalize` write locally, reserve the version's remote path, and leave the upload to
    `await flush()`. Use it as an async context manager (`async with DirWorlds() as worlds:`) to flush on success and
    clean up either way.
    """

    def __init__(self) -> None:
        self._tmp = Path(tempfile.mkdtemp(prefix="rl-worlds-"))
        self._local: dict[str, Path] = {}
        self._pending: list[tuple[Path, str, str]] = []

    async def __aenter__(self) -> DirWorlds:
        return self

    async def __aexit__(self, exc_type: object, exc: object, tb: object) -> None:
        try:
            if exc_type is None:
                await self.flush()
        finally:
            shutil.rmtree(self._tmp, ignore_errors=True)

    async def prefetch(self, version: str) -> None:
        """Download the sealed version `version` (a private copy) so `fork` and `read` can use it."""
        if version not in self._local:
            local = self._tmp / f"v{len(self._local)}"
            await Dir.from_existing_remote(version).download(local_path=local)  # a copy, even of a local path
            self._local[version] = local

    def stage(self, root: Path, name: str) -> str:
        """Reserve a remote path for the directory `root`, to be uploaded by `flush`; returns it (the version)."""
        staged = self._tmp / f"staged-{len(self._pending)}" / name
        shutil.copytree(root, staged)
        destination = task_context().raw_data_path.get_random_remote_path(name)
        self._pending.append((staged, destination, compute_digest(read_dir(staged))))
        self._local[destination] = staged
        return destination

    async def flush(self) -> None:
        """Upload everything `seal` and `finalize` staged."""
        pending, self._pending = self._pending, []
        for staged, destination, digest in pending:
            await Dir.from_local(staged, remote_destination=destination, dir_cache_key=digest)

    def seal(self, name: str, files: Mapping[str, str], message: str) -> str:
        root = self._tmp / f"seal-{len(self._pending)}" / name
        for relpath, text in sorted(files.items()):
            path = root / relpath
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        return self.stage(root, name)

    def _local_copy(self, version: str) -> Path:
        try:
            return self._local[version]
        except KeyError:
            raise RuntimeError(f"world version {version} was not prefetched; await prefetch(version) first") from None

    def fork(self, version: str, name: str) -> Workspace:
        root = Path(tempfile.mkdtemp(prefix="fork-", dir=self._tmp)) / name
        shutil.copytree(self._local_copy(version), root)
        return _DirWorkspace(self, root, name)

    def read(self, version: str) -> dict[str, str]:
        return {relpath: data.decode() for relpath, data in read_dir(self._local_copy(version)).items()}


def _run_name() -> str:
    return task_context().action.run_name or "local"


# ----------------------------------------------------------------------------------------------------------- tasks

JUDGE_CALLS: Counter[tuple[str, str]] = Counter()
"""Judge calls this process made, by (trial, rubric): the seed counts "JUDGE CALLED" log lines the same way."""


@flyte.trace
async def call_judge(traj: Trajectory, rubric: Rubric) -> float:
    """The vendor LLM judge's stand-in (`rl.agentic.judge.judge_score`). Traced: a retry replays, never re-bills."""
    JUDGE_CALLS[(traj.trial_id, rubric.name)] += 1
    flyte.logger.info(f"JUDGE CALLED trial={traj.trial_id} rubric={rubric.name}")
    return judge_score(traj, rubric)


@sandbox_env.task(cache="auto")
async def build_world(world_id: str, seed: int) -> WorldRef:
    """Populate the world's files once and seal them; every trial forks this version."""
    async with DirWorlds() as worlds:
        return await SandboxTier(worlds, run_name=_run_name).build_world(world_id, seed)


@sandbox_env.task(cache="auto", retries=1, timeout=GENERATE_TIMEOUT)
async def generate(
    spec: TrialSpec, weights: Weights, world: WorldRef, flaky_rate: float = 0.0, tool_latency_s: float = 0.2
) -> Trajectory:
    """One trial in a private copy of its world, driven by the current weights; seeded by the trial id."""
    async with DirWorlds() as worlds:
        await worlds.prefetch(world.version)
        sandbox = SandboxTier(worlds, attempt=attempt_number, run_name=_run_name, tool_latency_s=tool_latency_s)
        return await sandbox.generate(spec, weights, world, flaky_rate)


@judge_env.task(retries=2)
async def verify_and_judge(traj: Trajectory, rubric: Rubric, judge_flake_rate: float = 0.0) -> Reward:
    """The deterministic verifier, then the (traced) judge against `rubric`; reward = 1[verified] + judge score."""
    return await JudgeTier(call_judge, attempt=attempt_number).verify_and_judge(traj, rubric, judge_flake_rate)


@agentic_trainer_env.task
async def setup_trainer(world_ids: list[str]) -> Weights:
    """Version 0: a uniform prior over every world's documents."""
    return initial_weights(world_ids)


@agentic_trainer_env.task(retries=1, timeout=TRAIN_TIMEOUT)
async def train_step(step: int, weights: Weights, rewards: list[Reward], lr: float = 2.0) -> StepResult:
    """One bandit update as a pure function of (weights, canonical rewards, lr): a replayed step recomputes it."""
    if weights.version != step:
        raise ValueError(f"step {step} must train weights version {step}, got version {weights.version}")
    return step_result(step, rewards, bandit_update(weights, rewards, lr), os.getpid())


# ------------------------------------------------------------------------------- the tiers, as awaits of the tasks


class FlyteAgenticTiers:
    """`rl.loop.agentic.AgenticTiers` whose methods await the tasks above; publishes the report after every step.

    The trainer is pure, so these tiers hand it the weights it trains: those of `setup_trainer`, then of each step.
    """

    def __init__(self, config: AgenticRunConfig, rubric: Rubric, notes: list[str]) -> None:
        self.config, self.rubric, self.notes = config, rubric, notes
        self.weights: Weights | None = None
        self.history: list[StepResult] = []

    def driver_attempt(self) -> int:
        return attempt_number()

    async def build_world(self, world_id: str, seed: int) -> WorldRef:
        return await build_world(world_id, seed)

    async def setup_trainer(self, world_ids: list[str]) -> Weights:
        self.weights = await setup_trainer(world_ids)
        return self.weights

    async def generate(self, spec: TrialSpec, weights: Weights, world: WorldRef, flaky_rate: float) -> Trajectory:
        return await generate(spec, weights, world, flaky_rate, self.config.tool_latency_s)

    async def verify_and_judge(self, traj: Trajectory, rubric: Rubric, judge_flake_rate: float) -> Reward:
        return await verify_and_judge(traj, rubric, judge_flake_rate)

    async def train_step(self, step: int, rewards: list[Reward], world_ids: list[str], lr: float) -> StepResult:
        if self.weights is None:
            raise RuntimeError("setup_trainer must run before the first train_step")
        result = await train_step(step, self.weights, rewards, lr)
        self.weights = result.weights
        self.history.append(result)
        await self.publish("running")
        return result

    async def publish(self, status: str, skipped: list[SkippedTrial] | None = None) -> None:
        await flyte.report.replace.aio(
            render_agentic_report(self.history, self.config, self.rubric, status, self.notes, skipped or []),
            do_flush=True,
        )


def render_agentic_report(
    history: list[StepResult],
    config: AgenticRunConfig,
    rubric: Rubric,
    status: str,
    notes: list[str],
    skipped: list[SkippedTrial],
) -> str:
    """The driver's report: one row per step, the trials skipped, and what this mode could not show."""
    trials = config.prompts_per_step * config.n_samples
    rows = "".join(
        f"<tr><td>{h.step}</td><td>{h.n_trials}/{trials}</td><td>{h.mean_reward}</td><td>{h.mean_turns}</td>"
        f"<td>v{h.weights.version}</td></tr>"
        for h in history
    )
    skipped_html = "".join(f"<li>{html.escape(s.trial_id)} ({html.escape(s.stage)})</li>" for s in skipped)
    notes_html = "".join(f"<li>{html.escape(n)}</li>" for n in notes)
    return (
        f"<h2>Agentic RL</h2><p>status: <b>{html.escape(status)}</b> · rubric {html.escape(rubric.name)} · "
        f"{config.n_steps} steps x {config.prompts_per_step} prompts x {config.n_samples} samples over "
        f"{config.n_worlds} worlds · driver attempt {attempt_number()}</p>"
        "<table><tr><th>step</th><th>trials</th><th>mean reward</th><th>mean turns</th><th>weights</th></tr>"
        f"{rows}</table>"
        + (f"<h3>Skipped trials</h3><ul>{skipped_html}</ul>" if skipped else "")
        + (f"<h3>Not exercised in this run</h3><ul>{notes_html}</ul>" if notes else "")
    )


@agentic_driver_env.task(report=True, retries=1)
async def train(
    config: AgenticRunConfig = SMOKE,
    rubric: Rubric = DEFAULT_RUBRIC,
    crash_driver_at_step: int = -1,
    flaky_trial_rate: float = 0.0,
    judge_flake_rate: float = 0.0,
) -> AgenticRunResult:
    """Seed 002's driver: build worlds, attach the trainer, then per step fan out trials, judge each as it lands,
    skip failed trials, and take one train step on canonically ordered rewards."""
    config.check_inputs(crash_driver_at_step, flaky_trial_rate, judge_flake_rate)
    local = is_local()
    if local and crash_driver_at_step >= 0:
        raise RemoteOnlyError(
            "crash_driver_at_step needs a cluster: Flyte's local mode never sets FLYTE_ATTEMPT_NUMBER, so the crash "
            "would repeat on every attempt. The simulator shows the replay: rl demo agentic --crash-driver-at-step 1"
        )
    notes = list(REMOTE_ONLY) if local else []
    tiers = FlyteAgenticTiers(config, rubric, notes)
    outcome: AgenticOutcome = await train_loop(
        tiers,
        n_steps=config.n_steps,
        n_worlds=config.n_worlds,
        prompts_per_step=config.prompts_per_step,
        n_samples=config.n_samples,
        rubric=rubric,
        crash_driver_at_step=crash_driver_at_step,
        flaky_trial_rate=flaky_trial_rate,
        judge_flake_rate=judge_flake_rate,
        seed=config.seed,
        lr=config.lr,
        max_turns=config.max_turns,
        group=flyte.group,
    )
    await tiers.publish("complete", outcome.skipped)
    return AgenticRunResult(
        history=outcome.history,
        skipped=outcome.skipped,
        driver_attempt=outcome.driver_attempt,
        local_mode=local,
        remote_only=notes,
    )


def fork(run_name: str, rubric: Rubric, force_rerun_actions: list[str] | None = None) -> Any:
    """Fork the finished run `run_name` with a new rubric, recovering its succeeded actions (a Flyte cluster only).

    Needs `flyte.init_from_config()` first. On flyte 2.12 recovery matches the source run's succeeded actions by their
    deterministic names; name an action in `force_rerun_actions` to re-execute it against the new inputs anyway.
    Returns the new `flyte.remote.Run`.
    """
    try:
        return flyte.rerun(run_name, recover=True, force_rerun_actions=force_rerun_actions, rubric=rubric)
    except NotImplementedError as exc:
        raise RemoteOnlyError(
            f"fork needs a Flyte cluster (flyte.rerun says: {exc}). Locally, re-score by running train again with the "
            "new rubric: the cached build_world and generate actions are reused, judging and training re-run"
        ) from exc


def main(argv: list[str] | None = None) -> int:
    """`python -m rl.flyte.agentic run [--local] [...]`, or `... fork RUN --rubric-name v2 [...]` on a cluster."""
    parser = argparse.ArgumentParser(prog="python -m rl.flyte.agentic", description=main.__doc__)
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
    inputs = {
        "config": STRESS if args.stress else SMOKE,
        "crash_driver_at_step": args.crash_driver_at_step,
        "flaky_trial_rate": args.flaky_trial_rate,
        "judge_flake_rate": args.judge_flake_rate,
    }
    if args.local:
        run = flyte.with_runcontext(mode="local").run(train, **inputs)
    else:
        flyte.init_from_config()
        run = flyte.run(train, **inputs)
    print(run.url)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
