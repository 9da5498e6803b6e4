"""The GRPO + LoRA loop of seeds 000 and 004 as Flyte tasks: thin recipes over the tested components.

Tasks (each one action; environments in `rl.flyte.envs`):

- `build_base` (train tier, cached): the tiny base model, built offline from its config, as a `flyte.io.Dir`.
- `init_adapter` (train tier): version 0 — a fresh LoRA adapter and AdamW state (`PeftTrainer.init_adapter`).
- `generate` (rollout tier): one group per call, seeded, with sampling log-probs — vLLM on a GPU or the torch sampler
  on a CPU, as `EngineSpec.kind` says. The engine is built once per process, so a warm replica keeps it.
- `score_group` (reward tier): the named verifiable reward over one group (`RewardScorer`).
- `train_step` (train tier): one GRPO step (`PeftTrainer.train_step`); adapter and optimizer state in and out as Dirs.
- `evaluate` (rollout tier): k samples per held-out problem, avg@k and pass@k (`SamplingEvaluator`).
- `train_rl` (driver, `report=True`): `rl.loop.grpo.run_grpo` over `grpo_tiers(...)`, whose methods await the tasks
  above; a `flyte.group` per iteration; checkpoint and resume through `flyte.ctx().checkpoint`.

Every pure step is `cache="auto"` and a pure function of its inputs (seeded sampling, pinned torch threads, adapters
identified by content digest), so a retried task or a rerun of the loop recomputes — or reuses — the same outputs.

Run it: `flyte run rl/flyte/grpo.py train_rl` (the smoke profile), or `python -m rl.flyte.grpo --local` here.
"""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

import flyte
from flyte.io import Dir

from rl.flyte.bindings import (
    DirArtifacts,
    FlyteReporter,
    dir_of,
    local_base,
    quiet_transformers,
    ref_of,
    upload_dir,
)
from rl.flyte.checkpoint_store import CrashAfterCheckpoint, FlyteStateStore
from rl.flyte.config import PROFILES, EngineSpec, GrpoRunConfig, problem_set, smoke
from rl.flyte.envs import (
    BUFFER_TIMEOUT,
    REWARD_TIMEOUT,
    ROLLOUT_TIMEOUT,
    TRAIN_TIMEOUT,
    buffer_env,
    grpo_driver_env,
    reward_env,
    rollout_env,
    train_env,
)
from rl.identity import content_digest
from rl.loop.grpo import GrpoTiers, run_grpo
from rl.models.tiny import TinyModelConfig
from rl.problems import constant_baseline_accuracy
from rl.protocols import RolloutEngine, StateStore
from rl.trainer.config import TrainerConfig
from rl.types import (
    ArtifactRef,
    EvalResult,
    IterationMetrics,
    Rollout,
    RolloutRequest,
    StepMetrics,
    TrainBatch,
    TrainResult,
)

__all__ = [
    "GrpoRunResult",
    "TrainOutput",
    "add_rollouts",
    "buffer_env",
    "build_base",
    "evaluate",
    "generate",
    "grpo_driver_env",
    "grpo_tiers",
    "init_adapter",
    "reward_env",
    "rollout_env",
    "run_driver",
    "score_group",
    "train_env",
    "train_rl",
    "train_step",
]


@dataclass(frozen=True)
class TrainOutput:
    """What a train task returns: the new adapter and optimizer state as Dirs (hash = content digest), and metrics."""

    adapter: Dir
    optimizer_state: Dir
    version: int
    metrics: StepMetrics

    @classmethod
    def of(cls, result: TrainResult) -> TrainOutput:
        return cls(dir_of(result.adapter), dir_of(result.optimizer_state), result.version, result.metrics)

    def result(self) -> TrainResult:
        return TrainResult(ref_of(self.adapter), ref_of(self.optimizer_state), self.version, self.metrics)


@dataclass(frozen=True)
class GrpoRunResult:
    """The driver's output: the final adapter and optimizer state, the report's history and the evaluations."""

    adapter: Dir
    optimizer_state: Dir
    adapter_version: int
    history: list[IterationMetrics] = field(default_factory=list)
    evals: list[EvalResult] = field(default_factory=list)
    resumed_from: int = -1
    # The rollout buffer's last version (a Dir of iter-NNNNN.jsonl files) and its content digest; "" when not kept.
    rollouts_uri: str = ""
    rollouts_digest: str = ""


def _batch(
    adapter: Dir, optimizer_state: Dir, rollouts: list[Rollout], rewards: list[float], step: int, new_version: int
) -> TrainBatch:
    return TrainBatch(
        step=step,
        rollouts=rollouts,
        rewards=rewards,
        adapter=ref_of(adapter),
        optimizer_state=None if optimizer_state.is_empty else ref_of(optimizer_state),
        new_version=new_version,
    )


# ------------------------------------------------------------------------------------------------------- engines

_ENGINES: dict[str, RolloutEngine] = {}


def _make_engine(base_dir: Path, spec: EngineSpec) -> RolloutEngine:
    if spec.kind == "vllm":
        from rl.engines.vllm import VLLMEngine, model_max_len  # imports vllm itself only when it first samples
        from rl.models import load_tokenizer

        tokenizer = load_tokenizer(base_dir) if spec.token_ids else None
        llm_kwargs = spec.vllm_kwargs(model_max_len(base_dir))
        return VLLMEngine(base_dir, DirArtifacts(), llm_kwargs=llm_kwargs, tokenizer=tokenizer)
    from rl.engines.torch_sampler import TorchSampler

    return TorchSampler(base_dir, DirArtifacts(), threads=spec.threads, merge_adapters=spec.merge_adapters)


async def engine_for(base: Dir, spec: EngineSpec) -> RolloutEngine:
    """The engine for (base model, spec), built on first use and kept for the process (one at a time)."""
    key = content_digest(base.path, base.hash or "", spec)
    engine = _ENGINES.get(key)
    if engine is None:
        _ENGINES.clear()  # one resident engine per replica: a GPU holds one base model
        engine = _ENGINES[key] = _make_engine(await local_base(base), spec)
    return engine


def train_device() -> str:
    """Where a train task computes: the pod's GPU when it has one, else the CPU (artifacts never name a device)."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


# --------------------------------------------------------------------------------------------------------- tasks


@train_env.task(cache="auto", retries=2, timeout=TRAIN_TIMEOUT)
async def build_base(model: TinyModelConfig) -> Dir:
    """The tiny base model for `model`, built offline (byte-identical for one config, hence cached)."""
    from rl.models.tiny import build_tiny_model

    quiet_transformers()
    with tempfile.TemporaryDirectory(prefix="rl-base-") as tmp:
        return await upload_dir(build_tiny_model(Path(tmp) / "base-model", model), "base-model")


@train_env.task(cache="auto", retries=2, timeout=TRAIN_TIMEOUT)
async def init_adapter(base: Dir, seed: int, trainer: TrainerConfig) -> TrainOutput:
    """Adapter version 0 (a function of `seed`) and a fresh optimizer state."""
    from rl.trainer.peft_trainer import PeftTrainer

    peft = PeftTrainer(await local_base(base), DirArtifacts(), trainer, device=train_device())
    return TrainOutput.of(await peft.init_adapter(seed))


@rollout_env.task(cache="auto", retries=2, timeout=ROLLOUT_TIMEOUT)
async def generate(base: Dir, adapter: Dir, request: RolloutRequest, engine: EngineSpec) -> list[Rollout]:
    """One group: `request.n` seeded completions of one prompt from `adapter`, with their sampling log-probs."""
    request = replace(request, adapter=ref_of(adapter))
    return await (await engine_for(base, engine)).generate(request)


@reward_env.task(cache="auto", retries=2, timeout=REWARD_TIMEOUT)
async def score_group(rollouts: list[Rollout], reward: str = "default") -> list[float]:
    """One reward per rollout of one group, in order (one reward task per group, not per rollout)."""
    from rl.scoring import RewardScorer

    return await RewardScorer(reward).score_group(rollouts)


@train_env.task(cache="auto", retries=2, timeout=TRAIN_TIMEOUT)
async def train_step(
    base: Dir,
    adapter: Dir,
    optimizer_state: Dir,
    rollouts: list[Rollout],
    rewards: list[float],
    step: int,
    new_version: int,
    trainer: TrainerConfig,
) -> TrainOutput:
    """One GRPO step: adapter `new_version - 1` and its optimizer state in, version `new_version` out."""
    from rl.trainer.peft_trainer import PeftTrainer

    batch = _batch(adapter, optimizer_state, rollouts, rewards, step, new_version)
    peft = PeftTrainer(await local_base(base), DirArtifacts(), trainer, device=train_device())
    return TrainOutput.of(await peft.train_step(batch))


@rollout_env.task(cache="auto", retries=1, timeout=ROLLOUT_TIMEOUT)
async def evaluate(
    base: Dir, adapter: Dir, policy_version: int, k: int, seed: int, problems: str, max_tokens: int, engine: EngineSpec
) -> EvalResult:
    """Held-out evaluation of one adapter: k samples per problem of the named set."""
    from rl.scoring import SamplingEvaluator

    evaluator = SamplingEvaluator(
        await engine_for(base, engine), problem_set(problems).eval_prompts(), max_tokens=max_tokens
    )
    return await evaluator.evaluate(ref_of(adapter), policy_version, k, seed)


@buffer_env.task(retries=2, timeout=BUFFER_TIMEOUT)
async def add_rollouts(parent: Dir | None, iteration: int, rollouts: list[Rollout], rewards: list[float]) -> Dir:
    """Seed 000's rollout buffer on open-source Flyte: a new version = the parent's files + `iter-NNNNN.jsonl`.

    Union's volumes fork copy-on-write; a Dir version is a copy, so each version stores every iteration so far. The
    rows are `rl.volumes.buffer`'s (they load with `pandas.read_json(lines=True)`), and `rl rescore` reads the same
    format. Adding an iteration the parent already holds with the same rows (a replayed step) returns the parent.
    """
    from rl.volumes.buffer import IterationExistsError, encode_rows, iteration_file, rollout_rows

    store = DirArtifacts()
    files = await store.get(ref_of(parent)) if parent is not None else {}
    name, payload = iteration_file(iteration), encode_rows(iteration, rollout_rows(iteration, rollouts, rewards))
    if name in files:
        if files[name] == payload:
            assert parent is not None
            return parent
        raise IterationExistsError(
            f"buffer version {parent.path if parent else ''} already holds iteration {iteration} with other rows; "
            "a driver must add each iteration once, to the version its checkpoint names"
        )
    return dir_of(await store.put({**files, name: payload}, name=f"rollouts-iter-{iteration:05d}"))


def buffer_version(ref: ArtifactRef) -> str:
    """The `RolloutSink` version string of a buffer Dir: `<uri>@<digest>` (the checkpoint stores it)."""
    return f"{ref.uri}@{ref.digest}"


def buffer_ref(version: str) -> ArtifactRef:
    uri, _, digest = version.rpartition("@")
    return ArtifactRef(uri=uri, digest=digest)


# ------------------------------------------------------------------------------- the tiers, as awaits of the tasks


class TrainTask(Protocol):
    """The call shape of `train_step` and `rl.flyte.clustered.train_step_clustered`."""

    async def __call__(
        self,
        base: Dir,
        adapter: Dir,
        optimizer_state: Dir,
        rollouts: list[Rollout],
        rewards: list[float],
        step: int,
        new_version: int,
        trainer: TrainerConfig,
    ) -> TrainOutput: ...


@dataclass(frozen=True)
class _TaskEngine:
    base: Dir
    spec: EngineSpec

    async def generate(self, request: RolloutRequest) -> list[Rollout]:
        return await generate(self.base, dir_of(request.adapter), request, self.spec)


@dataclass(frozen=True)
class _TaskScorer:
    reward: str

    async def score_group(self, rollouts: Any) -> list[float]:
        return await score_group(list(rollouts), self.reward)


@dataclass(frozen=True)
class _TaskTrainer:
    base: Dir
    config: TrainerConfig
    step_task: TrainTask

    async def init_adapter(self, seed: int) -> TrainResult:
        return (await init_adapter(self.base, seed, self.config)).result()

    async def train_step(self, batch: TrainBatch) -> TrainResult:
        optimizer_state = dir_of(batch.optimizer_state) if batch.optimizer_state is not None else Dir.empty()
        out = await self.step_task(
            self.base,
            dir_of(batch.adapter),
            optimizer_state,
            list(batch.rollouts),
            list(batch.rewards),
            batch.step,
            batch.new_version,
            self.config,
        )
        return out.result()


@dataclass(frozen=True)
class _TaskEvaluator:
    base: Dir
    config: GrpoRunConfig

    async def evaluate(self, adapter: ArtifactRef, policy_version: int, k: int, seed: int) -> EvalResult:
        config = self.config
        return await evaluate(
            self.base, dir_of(adapter), policy_version, k, seed, config.problems, config.grpo.max_tokens, config.engine
        )


@dataclass(frozen=True)
class _TaskBuffer:
    async def append(
        self, iteration: int, rollouts: Sequence[Rollout], rewards: Sequence[float], parent: str | None
    ) -> str:
        parent_dir = dir_of(buffer_ref(parent)) if parent is not None else None
        out = await add_rollouts(parent_dir, iteration, list(rollouts), list(rewards))
        return buffer_version(ref_of(out))


def grpo_tiers(config: GrpoRunConfig, base: Dir, *, step_task: TrainTask, title: str) -> GrpoTiers:
    """The driver's tiers: each method awaits a task; artifacts are Dirs; one `flyte.group` per iteration."""
    problems = problem_set(config.problems)
    reporter = FlyteReporter(
        title=title,
        baseline_accuracy=constant_baseline_accuracy(problems.eval_prompts()),
        notes=[
            f"profile {config.profile} · model {config.model.uri or 'tiny (built offline)'} · engine "
            f"{config.engine.kind} · {config.grpo.prompts_per_iteration} prompts x {config.grpo.group_size} samples · "
            f"{'pipelined' if config.grpo.pipelined else 'sequential'}"
        ],
    )
    return GrpoTiers(
        engine=_TaskEngine(base, config.engine),
        scorer=_TaskScorer(config.reward),
        trainer=_TaskTrainer(base, config.trainer, step_task),
        artifacts=DirArtifacts(),
        prompts=problems,
        evaluator=_TaskEvaluator(base, config) if config.grpo.evaluate else None,
        reporter=reporter,
        group=flyte.group,
        buffer=_TaskBuffer() if config.keep_rollouts else None,
        task_metrics=problems.metrics,
    )


async def run_driver(config: GrpoRunConfig, *, step_task: TrainTask, title: str) -> GrpoRunResult:
    """The body of both drivers: resolve the base model, bind the tiers, run (or resume) `run_grpo`."""
    config.check()  # a config made without validation (`model_construct`) still fails before the first task
    base = Dir.from_existing_remote(config.model.uri) if config.model.uri else await build_base(config.model.tiny)
    ctx = flyte.ctx()
    store: StateStore = FlyteStateStore(ctx.checkpoint if ctx is not None else None)
    if config.faults.crash_after_iteration >= 0:
        store = CrashAfterCheckpoint(store, config.faults.crash_after_iteration, config.faults.crash_marker)
    outcome = await run_grpo(config.grpo, grpo_tiers(config, base, step_task=step_task, title=title), store)
    rollouts = buffer_ref(outcome.buffer_version) if outcome.buffer_version else ArtifactRef("", "")
    return GrpoRunResult(
        adapter=dir_of(outcome.adapter),
        optimizer_state=dir_of(outcome.optimizer_state),
        adapter_version=outcome.adapter_version,
        history=list(outcome.history),
        evals=list(outcome.evals),
        resumed_from=outcome.resumed_from,
        rollouts_uri=rollouts.uri,
        rollouts_digest=rollouts.digest,
    )


SMOKE = smoke()


@grpo_driver_env.task(report=True, retries=2)
async def train_rl(config: GrpoRunConfig = SMOKE) -> GrpoRunResult:
    """The GRPO loop: fan out rollouts, score each group as it lands, one train step, checkpoint, report; repeat.

    A retried attempt (after a crash or a preemption) resumes after the last checkpointed iteration with its history;
    a new run starts from iteration 0.
    """
    return await run_driver(config, step_task=train_step, title="GRPO + LoRA")


def main(argv: list[str] | None = None) -> int:
    """`python -m rl.flyte.grpo [--local] [--profile smoke|stress --base-uri URI]`: run the loop."""
    parser = argparse.ArgumentParser(prog="python -m rl.flyte.grpo", description=main.__doc__)
    parser.add_argument("--profile", choices=sorted(PROFILES), default="smoke")
    parser.add_argument("--base-uri", default="", help="a prefetched model directory (required by --profile stress)")
    parser.add_argument("--iterations", type=int, default=None)
    parser.add_argument("--clustered", action="store_true", help="run train_rl_clustered (pipelined, DDP trainer)")
    parser.add_argument("--local", action="store_true", help="Flyte's local mode in this process, no cluster")
    args = parser.parse_args(argv)
    config = PROFILES["stress"](args.base_uri) if args.profile == "stress" else PROFILES[args.profile]()
    if args.base_uri and args.profile != "stress":
        config = config.replace(model=replace(config.model, uri=args.base_uri))
    if args.iterations is not None:
        config = config.replace(grpo=replace(config.grpo, iterations=args.iterations))
    task: Any = train_rl
    if args.clustered:
        from rl.flyte.clustered import train_rl_clustered

        config = config.replace(grpo=replace(config.grpo, pipelined=True))
        task = train_rl_clustered
    if args.local:
        run = flyte.with_runcontext(mode="local").run(task, config=config)
    else:
        flyte.init_from_config()
        run = flyte.run(task, config=config)
    print(run.url)
    if args.local:
        result = run.outputs()[0]
        for row in result.history:
            task = "".join(f" {name} {value:.3f}" for name, value in sorted(row.task_metrics.items()))
            print(f"iteration {row.iteration}: mean reward {row.mean_reward:.3f}{task}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
