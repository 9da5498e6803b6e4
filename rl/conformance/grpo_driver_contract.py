"""The GRPO driver's contract: a driver with `run_grpo`'s signature, run on the durable simulator with in-memory tiers.

The in-memory tiers are deterministic and their adapters carry a lineage (every step behind them), so the laws can read
from the final adapter alone whether any iteration was trained twice or skipped. The simulator kills the driver at
chosen await points, fails and hangs tasks and tears checkpoint writes, all from one seed (`--rl-seed`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pytest

from rl.conformance.capabilities import Capabilities, require
from rl.conformance.driver_checkpoint_laws import DriverCheckpointLaws
from rl.conformance.support.contract_base import ContractBase, Run, tier
from rl.deploy.simulated.artifacts import MemoryArtifacts
from rl.deploy.simulated.chaos import grpo_random, grpo_sweep
from rl.deploy.simulated.grpo_sim import Latencies, grpo_sim
from rl.deploy.simulated.grpo_tiers import LatencyModel, MemoryEngine, MemoryScorer, MemoryTrainer
from rl.errors import NonFiniteRewardError
from rl.loop.grpo import GrpoConfig, GrpoDriver, GrpoTiers, run_grpo
from rl.problems import DigitSuccessor
from rl.storage.checkpoint.memory_store import MemoryCheckpointStore
from rl.types import Rollout, RolloutRequest, TrainBatch, TrainResult

__all__ = ["LAW_RUN_SHAPE", "MODES", "RANDOM_SCENARIOS", "GrpoDriver", "GrpoDriverContract", "pipelined_mode"]

MODES = ("sequential", "pipelined")
LAW_RUN_SHAPE: dict[str, Any] = {"iterations": 3, "prompts_per_iteration": 2, "group_size": 3}
"""The driver laws' run: 3 iterations of 2 groups x 3 samples, small enough to kill at each of ~40 await points."""
RANDOM_SCENARIOS = 6
"""Seeded fault scenarios per mode: scenario seeds `rl_seed * 6 .. rl_seed * 6 + 5`."""

# The NaN laws inject one NaN here: iteration 1 (policy version 1 in the sequential loop), group 1, sample 2.
_NAN_VERSION, _NAN_GROUP, _NAN_SAMPLE = 1, 1, 2


def pipelined_mode(mode: str, capabilities: Capabilities) -> bool:
    """Whether `mode` is the pipelined one; skips the calling law when the implementation does not support it."""
    if mode == "pipelined":
        require(capabilities, "supports_pipelined", "the pipelined driver's laws")
    return mode == "pipelined"


def _violations(lines: Sequence[str], limit: int = 12) -> str:
    more = f"\n... and {len(lines) - limit} more" if len(lines) > limit else ""
    return "\n".join(lines[:limit]) + more


class _NanScorer(MemoryScorer):
    """The in-memory scorer, except one `value` (NaN unless told) at (policy version 1, group 1, sample 2)."""

    def __init__(self, value: float = float("nan")) -> None:
        super().__init__()
        self.value = value

    async def score_group(self, rollouts: Sequence[Rollout]) -> list[float]:
        rewards = await super().score_group(rollouts)
        if rollouts and rollouts[0].group_id == _NAN_GROUP and rollouts[0].policy_version == _NAN_VERSION:
            rewards[_NAN_SAMPLE] = self.value
        return rewards


class _RecordingEngine:
    """Records the order in which groups finish generating."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.finished: list[int] = []

    async def generate(self, request: RolloutRequest) -> list[Rollout]:
        group = await self.inner.generate(request)
        self.finished.append(request.group_id)
        return group


class _RecordingTrainer:
    """Records every batch the driver hands the trainer."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.batches: list[TrainBatch] = []

    async def init_adapter(self, seed: int) -> TrainResult:
        result: TrainResult = await self.inner.init_adapter(seed)
        return result

    async def train_step(self, batch: TrainBatch) -> TrainResult:
        self.batches.append(batch)
        result: TrainResult = await self.inner.train_step(batch)
        return result


def _plain_tiers(
    config: GrpoConfig, artifacts: MemoryArtifacts, scorer: MemoryScorer, buffer: _RecordingBuffer | None = None
) -> GrpoTiers:
    return GrpoTiers(
        engine=MemoryEngine(artifacts),
        scorer=scorer,
        trainer=MemoryTrainer(artifacts, max_staleness=config.max_staleness),
        artifacts=artifacts,
        prompts=DigitSuccessor(),
        buffer=buffer,
    )


class _RecordingBuffer:
    """A `RolloutBuffer` that keeps every append: `(iteration, group ids, rewards)` in call order. A version id is the
    digest of the rows so far, so appending the same rows again returns the same version, as the protocol says."""

    def __init__(self) -> None:
        self.appends: list[tuple[int, tuple[int, ...], tuple[float, ...]]] = []
        self.rows: dict[int, tuple[tuple[int, ...], tuple[float, ...]]] = {}

    async def append(
        self, iteration: int, rollouts: Sequence[Rollout], rewards: Sequence[float], parent: str | None
    ) -> str:
        row = (tuple(r.group_id for r in rollouts), tuple(float(x) for x in rewards))
        self.appends.append((iteration, *row))
        self.rows[iteration] = row
        return repr(sorted(self.rows.items()))


def _first_batch_difference(a: Sequence[TrainBatch], b: Sequence[TrainBatch]) -> str:
    if len(a) != len(b):
        return f"{len(a)} train steps in one run, {len(b)} in the other"
    for x, y in zip(a, b, strict=True):
        if x != y:
            order_x, order_y = [r.group_id for r in x.rollouts], [r.group_id for r in y.rollouts]
            detail = f"groups in order {order_x} vs {order_y}" if order_x != order_y else "different inputs"
            return f"step {x.step} got {detail}"
    return "no difference"


@tier("driver")
class GrpoDriverContract(DriverCheckpointLaws, ContractBase):
    """Laws of a GRPO driver: durable resume, fault tolerance, canonical step inputs, loud non-finite rewards, one
    history row per iteration, and checkpoints it cannot resume refused (`DriverCheckpointLaws`).

    Provide `driver` (default: `rl.loop.grpo.run_grpo`); override `driver_config` for a bigger run shape.
    """

    @pytest.fixture
    def driver(self) -> GrpoDriver:
        """Return your driver: an async callable `(config: GrpoConfig, tiers: GrpoTiers, store: CheckpointStore) ->
        GrpoOutcome`, like `rl.loop.grpo.run_grpo` (the default)."""
        return run_grpo

    @pytest.fixture
    def driver_config(self, rl_seed: int) -> GrpoConfig:
        """The run shape of the sweeps: 3 iterations of 2 groups x 3 samples with evaluation, run seed `rl_seed`.

        Small so that killing the driver at each of its ~40 await points takes about a second per mode.
        """
        return GrpoConfig(**LAW_RUN_SHAPE, seed=rl_seed)

    @pytest.mark.parametrize("mode", MODES)
    def test_driver_killed_at_every_await_point_resumes_to_the_uninterrupted_result(
        self, driver: GrpoDriver, driver_config: GrpoConfig, capabilities: Capabilities, mode: str
    ) -> None:
        """Killing the driver at any await point and resuming gives the uninterrupted run's adapter, optimizer state,
        history and evaluations bitwise, with every iteration trained exactly once and versions 1..N once each."""
        pipelined = pipelined_mode(mode, capabilities)
        reports = grpo_sweep(pipelined, driver=driver, config=driver_config, run_seed=driver_config.seed)
        assert reports, "the uninterrupted run had no await point to kill the driver at"
        bad = [f"killed at await point {r.seed}: {v}" for r in reports for v in r.violations]
        assert not bad, f"{len(bad)} violations over {len(reports)} kill points:\n{_violations(bad)}"

    @pytest.mark.parametrize("mode", MODES)
    def test_driver_keeps_every_invariant_under_seeded_random_faults(
        self, driver: GrpoDriver, driver_config: GrpoConfig, capabilities: Capabilities, rl_seed: int, mode: str
    ) -> None:
        """Under seeded task failures, hangs past timeouts, driver crashes and torn checkpoint writes, every run ends
        with its uninterrupted result and lineage."""
        pipelined = pipelined_mode(mode, capabilities)
        check = grpo_random(pipelined, driver=driver, config=driver_config)
        seeds = range(rl_seed * RANDOM_SCENARIOS, (rl_seed + 1) * RANDOM_SCENARIOS)
        bad = [f"fault scenario {s}: {v}" for s in seeds for v in check(s).violations]
        assert not bad, _violations(bad)

    @pytest.mark.parametrize("mode", MODES)
    def test_driver_train_step_inputs_do_not_depend_on_group_finish_order(
        self, driver: GrpoDriver, driver_config: GrpoConfig, capabilities: Capabilities, mode: str
    ) -> None:
        """Two runs whose groups finish in opposite orders hand the trainer identical batches (canonical order)."""
        pipelined = pipelined_mode(mode, capabilities)
        config = replace(driver_config, pipelined=pipelined)
        ascending = Latencies(generate=LatencyModel(base_s=1.0, jitter_s=100.0))
        descending = Latencies(generate=LatencyModel(base_s=100.0, jitter_s=-99.0))
        runs = []
        for latencies in (ascending, descending):
            setup = grpo_sim(config, seed=config.seed, latencies=latencies, driver=driver)
            engine, trainer = _RecordingEngine(setup.tiers.engine), _RecordingTrainer(setup.tiers.trainer)
            setup.tiers = replace(setup.tiers, engine=engine, trainer=trainer)
            result = setup.run()
            assert result.ok, f"the run failed: {result.error!r}"
            runs.append((engine.finished, trainer.batches))
        (order_a, batches_a), (order_b, batches_b) = runs
        assert batches_a == batches_b, (
            f"groups finished in order {order_a} in one run and {order_b} in the other, and the trainer's inputs "
            f"changed with it: {_first_batch_difference(batches_a, batches_b)}. Sort each batch by group id."
        )

    def test_driver_nan_reward_raises_naming_group_and_sample(
        self, driver: GrpoDriver, driver_config: GrpoConfig, rl_run: Run[Any]
    ) -> None:
        """A NaN reward raises `NonFiniteRewardError` (or a subclass) whose message names the group and the sample."""
        config = self._nan_config(driver_config)
        artifacts = MemoryArtifacts()
        with pytest.raises(NonFiniteRewardError) as caught:
            rl_run(driver(config, _plain_tiers(config, artifacts, _NanScorer()), MemoryCheckpointStore()))
        message = str(caught.value)
        assert re.search(rf"group\D{{0,3}}{_NAN_GROUP}\b", message), (
            f"the error does not name group {_NAN_GROUP}: {message}"
        )
        assert re.search(rf"sample\D{{0,3}}{_NAN_SAMPLE}\b", message), (
            f"the error does not name sample {_NAN_SAMPLE}: {message}"
        )

    def test_driver_nan_reward_commits_nothing_of_its_iteration(
        self, driver: GrpoDriver, driver_config: GrpoConfig, rl_run: Run[Any]
    ) -> None:
        """After a NaN reward stops a run, resuming with a fixed scorer gives exactly the run that never saw a NaN."""
        config = self._nan_config(driver_config)
        clean_artifacts, clean_buffer = MemoryArtifacts(), _RecordingBuffer()
        clean = rl_run(
            driver(config, _plain_tiers(config, clean_artifacts, MemoryScorer(), clean_buffer), MemoryCheckpointStore())
        )
        artifacts, store, buffer = MemoryArtifacts(), MemoryCheckpointStore(), _RecordingBuffer()
        with pytest.raises(NonFiniteRewardError):
            rl_run(driver(config, _plain_tiers(config, artifacts, _NanScorer(), buffer), store))
        failed_at = {it for it, *_ in buffer.appends}
        assert all(it < _NAN_VERSION for it in failed_at), (
            f"the rollout buffer received iteration(s) {sorted(failed_at - set(range(_NAN_VERSION)))} from the run "
            f"a NaN reward stopped in iteration {_NAN_VERSION}: part of the failed iteration was committed. "
            "Check every group's rewards before anything of the iteration is written"
        )
        resumed = rl_run(driver(config, _plain_tiers(config, artifacts, MemoryScorer(), buffer), store))
        assert buffer.rows == clean_buffer.rows, (
            "the rollout buffer after the NaN and the resume differs from the run that never saw the NaN"
        )
        assert resumed.adapter.digest == clean.adapter.digest, (
            "the resumed run's final adapter differs from the run that never saw the NaN: part of the failed "
            "iteration was committed (trained, or checkpointed with a replaced reward)"
        )
        assert resumed.optimizer_state.digest == clean.optimizer_state.digest, "the final optimizer state differs"
        assert resumed.history == clean.history, "the resumed run's history differs from the run that never saw the NaN"

    @pytest.mark.parametrize("sign", [1, -1], ids=["positive", "negative"])
    def test_driver_infinite_reward_is_refused_like_nan(
        self, driver: GrpoDriver, driver_config: GrpoConfig, rl_run: Run[Any], sign: int
    ) -> None:
        """An infinite reward raises `NonFiniteRewardError` like a NaN, before its iteration is trained."""
        config = self._nan_config(driver_config)
        value = sign * float("inf")
        artifacts = MemoryArtifacts()
        tiers = _plain_tiers(config, artifacts, _NanScorer(value))
        trainer = _RecordingTrainer(tiers.trainer)
        try:
            rl_run(driver(config, replace(tiers, trainer=trainer), MemoryCheckpointStore()))
            raised: Exception | None = None
        except Exception as exc:
            raised = exc
        where = f"a reward of {value} (group {_NAN_GROUP}, sample {_NAN_SAMPLE})"
        assert raised is not None, (
            f"{where} was trained on without an error: the driver checks for NaN only. Check rewards with "
            "math.isfinite and raise rl.errors.NonFiniteRewardError"
        )
        assert isinstance(raised, NonFiniteRewardError), (
            f"{where} raised {type(raised).__name__}: {raised} (after the driver let it through to "
            f"{'the trainer' if trainer.batches and trainer.batches[-1].step == _NAN_VERSION else 'elsewhere'}); "
            "expected rl.errors.NonFiniteRewardError. Check rewards with math.isfinite, not only for NaN"
        )
        trained = [b.step for b in trainer.batches]
        assert _NAN_VERSION not in trained, (
            f"the iteration with the reward {value} was trained (steps {trained}) before the error was raised"
        )

    @pytest.mark.parametrize("mode", MODES)
    def test_driver_history_has_one_row_per_iteration_in_order(
        self, driver: GrpoDriver, driver_config: GrpoConfig, capabilities: Capabilities, mode: str
    ) -> None:
        """The outcome's history has exactly one row per iteration, in order, each naming the adapter version it
        trained and the iteration's rollouts; the evaluations are one per evaluated version, in order."""
        config = replace(driver_config, pipelined=pipelined_mode(mode, capabilities))
        result = grpo_sim(config, seed=config.seed, driver=driver).run()
        assert result.ok, f"the run failed: {result.error!r}"
        rows = [(r.iteration, r.policy_version, r.num_rollouts) for r in result.output.history]
        rollouts = config.prompts_per_iteration * config.group_size
        want = [(it, it + 1, rollouts) for it in range(config.iterations)]
        assert rows == want, (
            f"history rows (iteration, adapter version, rollouts) are {rows}; want {want}: one row per trained "
            "iteration, recorded once, in order"
        )
        evaluated = [e.policy_version for e in result.output.evals]
        want_evals = [v for v in range(1, config.iterations + 1) if config.evaluates(v)]
        assert evaluated == want_evals, f"evaluated versions {evaluated}; want {want_evals}, each once, in order"

    @staticmethod
    def _nan_config(driver_config: GrpoConfig) -> GrpoConfig:
        """Sequential, with room for the NaN's group and sample and an iteration before it."""
        return replace(
            driver_config,
            pipelined=False,
            iterations=max(driver_config.iterations, _NAN_VERSION + 2),
            prompts_per_iteration=max(driver_config.prompts_per_iteration, _NAN_GROUP + 1),
            group_size=max(driver_config.group_size, _NAN_SAMPLE + 1),
        )
