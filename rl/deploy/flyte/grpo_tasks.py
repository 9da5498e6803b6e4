"""The GRPO loop's Flyte tasks (the training-loop and rollouts tutorials): thin recipes over the tested components, each
one action.

`build_base`, `init_adapter`, `train_step` (train tier), `generate` / `generate_groups` / `evaluate` (vLLM's GPU
rollout pod: one group, or as many as the GPU's plan allows, per call), `generate_on_cpu` / `evaluate_on_cpu` (the
torch sampler's CPU pod), `score_group` (reward tier) and `add_rollouts` (buffer tier); `RolloutTier` is the
driver's engine over the rollout tasks. Each in full: docs/flyte.md#the-modules.

Every pure step is `cache="auto"` and a pure function of its inputs (seeded sampling, pinned torch threads, adapters
identified by content digest), so a retried task or a rerun of the loop recomputes — or reuses — the same outputs.
The driver that calls them is `rl.deploy.flyte.grpo`.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from flyte.io import Dir

from rl.deploy.flyte.bindings import DirArtifacts, dir_of, local_base, quiet_transformers, ref_of, upload_dir
from rl.deploy.flyte.config import EngineSpec
from rl.deploy.flyte.envs import (
    BUFFER_TIMEOUT,
    REWARD_TIMEOUT,
    ROLLOUT_TIMEOUT,
    TRAIN_TIMEOUT,
    buffer_env,
    check_engine_placement,
    cpu_rollout_env,
    reward_env,
    rollout_env,
    train_env,
)
from rl.identity import content_digest
from rl.models.tiny import TinyModelConfig
from rl.problems import problem_set
from rl.protocols import RolloutEngine
from rl.trainer.config import TrainerConfig
from rl.types import (
    DEFAULT_SAMPLING,
    ArtifactRef,
    EvalResult,
    Rollout,
    RolloutRequest,
    SamplingSettings,
    StepMetrics,
    TrainBatch,
    TrainResult,
)

__all__ = [
    "BatchedRolloutTier",
    "RolloutTier",
    "TrainInput",
    "TrainOutput",
    "add_rollouts",
    "buffer_ref",
    "buffer_version",
    "build_base",
    "call_groups",
    "engine_for",
    "evaluate",
    "evaluate_on_cpu",
    "generate",
    "generate_groups",
    "generate_on_cpu",
    "init_adapter",
    "rollout_tier",
    "score_group",
    "train_device",
    "train_step",
]


@dataclass(frozen=True)
class TrainInput:
    """A train task's input beside its artifacts: the batch's rollouts, rewards, step and version, and the trainer.

    `train_step` and `rl.deploy.flyte.clustered.train_step_clustered` take `(base, adapter, optimizer_state, batch)`:
    the three artifacts as top-level `Dir`s and this. The Dirs stay outside it because Flyte keys a task's cache on a
    Dir's hash (its content digest) only for a top-level input; inside a dataclass its upload path enters the key, so
    the same adapter at a new path (a retried step's upload) would miss the cache.
    """

    rollouts: list[Rollout]
    rewards: list[float]
    step: int
    new_version: int
    trainer: TrainerConfig
    # The batch's sampling settings: the trainer teacher-forces the distribution the rollouts were drawn from.
    sampling: SamplingSettings = field(default=DEFAULT_SAMPLING, metadata={"identity": "omit_default"})

    @classmethod
    def of(cls, batch: TrainBatch, trainer: TrainerConfig) -> TrainInput:
        return cls(list(batch.rollouts), list(batch.rewards), batch.step, batch.new_version, trainer, batch.sampling)

    def batch(self, adapter: ArtifactRef, optimizer_state: ArtifactRef | None) -> TrainBatch:
        """The TrainBatch of these inputs on `adapter` and `optimizer_state` (None: a fresh optimizer)."""
        return TrainBatch(
            step=self.step,
            rollouts=self.rollouts,
            rewards=self.rewards,
            adapter=adapter,
            optimizer_state=optimizer_state,
            new_version=self.new_version,
            sampling=self.sampling,
        )


@dataclass(frozen=True)
class TrainOutput:
    """What a train task returns: the new adapter and optimizer state as Dirs (hash = content digest), and metrics."""

    adapter: Dir
    optimizer_state: Dir
    policy_version: int
    metrics: StepMetrics

    @classmethod
    def of(cls, result: TrainResult) -> TrainOutput:
        return cls(dir_of(result.adapter), dir_of(result.optimizer_state), result.policy_version, result.metrics)

    def result(self) -> TrainResult:
        return TrainResult(ref_of(self.adapter), ref_of(self.optimizer_state), self.policy_version, self.metrics)


# ------------------------------------------------------------------------------------------------------- engines

_ENGINES: dict[str, RolloutEngine] = {}


def _make_engine(base_path: Path, spec: EngineSpec) -> RolloutEngine:
    from rl.models.opened_model import open_model

    base_dir = open_model(base_path)  # this process's door: the engine loads only what this checked
    if spec.kind == "vllm":
        from rl.models import load_tokenizer
        from rl.samplers.vllm import VLLMEngine
        from rl.samplers.vllm_requests import model_max_len  # imports vllm itself only when it first samples

        tokenizer = load_tokenizer(base_dir) if spec.token_ids else None
        llm_kwargs = spec.vllm_kwargs(model_max_len(base_dir))
        return VLLMEngine(base_dir, DirArtifacts(), llm_kwargs=llm_kwargs, tokenizer=tokenizer)
    from rl.samplers.torch_sampler import TorchSampler

    return TorchSampler(base_dir, DirArtifacts(), threads=spec.threads, merge_adapters=spec.merge_adapters)


def evict_engines() -> None:
    """Drop the resident engine, closing it first where it can be closed: vLLM's engine core is a process of its own
    that holds its memory (and its files) until closed, not until the engine object is forgotten."""
    engines = list(_ENGINES.values())
    _ENGINES.clear()
    for engine in engines:
        close = getattr(engine, "close", None)
        if callable(close):
            close()


async def engine_for(base: Dir, spec: EngineSpec) -> RolloutEngine:
    """The engine for (base model, spec), built on first use and kept for the process (one at a time)."""
    key = content_digest(base.path, base.hash or "", spec)
    engine = _ENGINES.get(key)
    if engine is None:
        # One resident engine per replica: a GPU holds one base model. The old engine is closed before the new one
        # starts, because vLLM checks free GPU memory at start-up and a dropped engine's process still holds its share.
        evict_engines()
        engine = _ENGINES[key] = _make_engine(await local_base(base), spec)
    return engine


def train_device() -> str:
    """Where a train task computes: the pod's GPU when it was given one, the CPU when it was not (artifacts never name
    a device). A pod given a GPU that CUDA cannot use refuses (`rl.gpu.task_device`); it never trains on the CPU."""
    from rl.gpu import task_device

    return task_device()


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
    from rl.models.opened_model import open_model
    from rl.trainer.peft_trainer import PeftTrainer

    base_dir = open_model(await local_base(base), tokenizer=False)  # this task's door: the init loads what it checked
    peft = PeftTrainer(base_dir, DirArtifacts(), trainer, device=train_device())
    return TrainOutput.of(await peft.init_adapter(seed))


def _on_pod(engine: EngineSpec, pod: str) -> None:
    """A rollout task runs only the engine its pod is for (`RolloutTier` never sends another)."""
    if engine.kind != pod:
        from rl.errors import RolloutPlacementError

        raise RolloutPlacementError(f"engine kind {engine.kind!r} sent to the {pod} rollout pod; use RolloutTier")


async def _generate(base: Dir, adapter: Dir, request: RolloutRequest, engine: EngineSpec) -> list[Rollout]:
    request = replace(request, adapter=ref_of(adapter))
    return await (await engine_for(base, engine)).generate(request)


@rollout_env.task(cache="auto", retries=2, timeout=ROLLOUT_TIMEOUT)
async def generate(base: Dir, adapter: Dir, request: RolloutRequest, engine: EngineSpec) -> list[Rollout]:
    """One group on vLLM: `request.n` seeded completions of one prompt from `adapter`, with their sampling log-probs."""
    _on_pod(engine, "vllm")
    return await _generate(base, adapter, request, engine)


@rollout_env.task(cache="auto", retries=2, timeout=ROLLOUT_TIMEOUT)
async def generate_groups(
    base: Dir, adapter: Dir, requests: list[RolloutRequest], engine: EngineSpec
) -> list[list[Rollout]]:
    """Several groups on vLLM in one `generate` call, in order; each group's samples are what `generate` gives it
    alone (per-request seeds: the conformance suite's batch laws)."""
    _on_pod(engine, "vllm")
    ref = ref_of(adapter)
    vllm = await engine_for(base, engine)
    return await vllm.generate_groups([replace(r, adapter=ref) for r in requests])  # type: ignore[attr-defined]


@cpu_rollout_env.task(cache="auto", retries=2, timeout=ROLLOUT_TIMEOUT)
async def generate_on_cpu(base: Dir, adapter: Dir, request: RolloutRequest, engine: EngineSpec) -> list[Rollout]:
    """One group on the torch sampler: `generate`'s contract, on a CPU pod."""
    _on_pod(engine, "torch")
    return await _generate(base, adapter, request, engine)


@reward_env.task(cache="auto", retries=2, timeout=REWARD_TIMEOUT)
async def score_group(rollouts: list[Rollout], reward: str = "default") -> list[float]:
    """One reward per rollout of one group, in order (one reward task per group, not per rollout)."""
    from rl.scoring import RewardScorer

    return await RewardScorer(reward).score_group(rollouts)


@train_env.task(cache="auto", retries=2, timeout=TRAIN_TIMEOUT)
async def train_step(base: Dir, adapter: Dir, optimizer_state: Dir, batch: TrainInput) -> TrainOutput:
    """One GRPO step: adapter `new_version - 1` and its optimizer state (empty: a fresh one) in, `new_version` out."""
    from rl.models.opened_model import open_model
    from rl.trainer.peft_trainer import PeftTrainer

    base_dir = open_model(await local_base(base), tokenizer=False)  # this task's door: the step loads what it checked
    peft = PeftTrainer(base_dir, DirArtifacts(), batch.trainer, device=train_device())
    opt_ref = None if optimizer_state.is_empty else ref_of(optimizer_state)
    return TrainOutput.of(await peft.train_step(batch.batch(ref_of(adapter), opt_ref)))


async def _evaluate(
    base: Dir, adapter: Dir, policy_version: int, k: int, seed: int, problems: str, max_tokens: int, engine: EngineSpec
) -> EvalResult:
    from rl.scoring import SamplingEvaluator

    evaluator = SamplingEvaluator(
        await engine_for(base, engine), problem_set(problems).eval_prompts(), max_tokens=max_tokens
    )
    return await evaluator.evaluate(ref_of(adapter), policy_version, k, seed)


@rollout_env.task(cache="auto", retries=1, timeout=ROLLOUT_TIMEOUT)
async def evaluate(
    base: Dir, adapter: Dir, policy_version: int, k: int, seed: int, problems: str, max_tokens: int, engine: EngineSpec
) -> EvalResult:
    """Held-out evaluation of one adapter on vLLM: k samples per problem of the named set."""
    _on_pod(engine, "vllm")
    return await _evaluate(base, adapter, policy_version, k, seed, problems, max_tokens, engine)


@cpu_rollout_env.task(cache="auto", retries=1, timeout=ROLLOUT_TIMEOUT)
async def evaluate_on_cpu(
    base: Dir, adapter: Dir, policy_version: int, k: int, seed: int, problems: str, max_tokens: int, engine: EngineSpec
) -> EvalResult:
    """`evaluate` on the torch sampler, on a CPU pod."""
    _on_pod(engine, "torch")
    return await _evaluate(base, adapter, policy_version, k, seed, problems, max_tokens, engine)


def call_groups(requests: Sequence[RolloutRequest], per_call: int) -> list[list[RolloutRequest]]:
    """`requests` cut, in order, into calls of at most `per_call` groups that share one adapter."""
    calls: list[list[RolloutRequest]] = []
    for request in requests:
        if calls and len(calls[-1]) < per_call and calls[-1][0].adapter == request.adapter:
            calls[-1].append(request)
        else:
            calls.append([request])
    return calls


@dataclass(frozen=True)
class RolloutTier:
    """The driver's rollout engine over the tasks: vLLM's on its GPU pods, the torch sampler's on CPU pods. With
    `spec.groups_per_call > 1` it batches (`generate_groups`): an iteration's groups in calls of that many, all in
    flight at once, results in request order; each group's rollouts are what a call of its own gives."""

    base: Dir
    spec: EngineSpec

    def __post_init__(self) -> None:
        check_engine_placement(self.spec.kind)  # vLLM where the tiers deploy no GPU: refused before any task

    async def generate(self, request: RolloutRequest) -> list[Rollout]:
        task = generate if self.spec.kind == "vllm" else generate_on_cpu
        return await task(self.base, dir_of(request.adapter), request, self.spec)

    async def evaluate(self, adapter: ArtifactRef, policy_version: int, k: int, seed: int, problems: str,
                       max_tokens: int) -> EvalResult:  # fmt: skip
        task = evaluate if self.spec.kind == "vllm" else evaluate_on_cpu
        return await task(self.base, dir_of(adapter), policy_version, k, seed, problems, max_tokens, self.spec)


@dataclass(frozen=True)
class BatchedRolloutTier(RolloutTier):
    """`RolloutTier` for vLLM with several groups per call (`BatchedRolloutEngine`)."""

    async def generate_groups(self, requests: Sequence[RolloutRequest]) -> list[list[Rollout]]:
        calls = call_groups(requests, self.spec.groups_per_call)
        done = await asyncio.gather(
            *(generate_groups(self.base, dir_of(c[0].adapter), list(c), self.spec) for c in calls)
        )
        return [group for call in done for group in call]


def rollout_tier(base: Dir, spec: EngineSpec) -> RolloutTier:
    """The driver's rollout engine for `spec`: batched where vLLM takes several groups per call."""
    return (BatchedRolloutTier if spec.groups_per_call > 1 else RolloutTier)(base, spec)


@buffer_env.task(retries=2, timeout=BUFFER_TIMEOUT)
async def add_rollouts(parent: Dir | None, iteration: int, rollouts: list[Rollout], rewards: list[float]) -> Dir:
    """The training-loop tutorial's rollout buffer on open-source Flyte: a new version = the parent's files +
    `iter-NNNNN.jsonl`.

    Union's volumes fork copy-on-write; a Dir version is a copy, so each version stores every iteration so far. The
    rows are `rl.storage.volumes.buffer`'s (they load with `pandas.read_json(lines=True)`), and `rl rescore` reads the
    same format. Adding an iteration the parent already holds with the same rows (a replayed step) returns the parent.
    """
    from rl.errors import IterationExistsError
    from rl.storage.volumes.buffer import encode_rows, iteration_file, rollout_rows

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
    """The `RolloutBuffer` version string of a buffer Dir: `<uri>@<digest>` (the checkpoint stores it)."""
    return f"{ref.uri}@{ref.digest}"


def buffer_ref(version: str) -> ArtifactRef:
    uri, _, digest = version.rpartition("@")
    return ArtifactRef(uri=uri, digest=digest)
