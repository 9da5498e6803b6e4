"""The agentic loop's contract (the agentic tutorial): run on the durable simulator with the fork's driver, judge tier
and trainer.

Each part is a fixture defaulting to ours, so a fork overrides only what it changed:

- `agentic_driver`: `async (config, tiers) -> AgenticOutcome`, like `rl.loop.agentic.run_agentic`;
- `judge_tier(judge, trace)`: the judge tier over the vendor `judge`, memoised with the durable `trace`;
- `policy_trainer(world_ids, identity)`: the long-lived trainer with exactly-once `update(step, rewards, lr)`.

The simulator bills the judge per answered (trial, rubric), fails and hangs tasks, retries them with the tutorial's
options, and kills the driver at chosen await points; the worlds are in-memory copy-on-write forks.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import pytest

from rl.conformance.support.contract_base import ContractBase, tier
from rl.deploy.simulated.agentic_sim import (
    AgenticDriver,
    AgenticSim,
    JudgeTierFactory,
    TrainerFactory,
    bandit_trainer,
    default_inputs,
    traced_judge_tier,
)
from rl.deploy.simulated.chaos_agentic import SEED_FAILURES, agentic_sweep, all_trial_ids
from rl.durable.faults import FaultPlan
from rl.loop.agentic import AgenticOutcome, run_agentic
from rl.types import Reward, Rubric, TrainerInfo, Weights

__all__ = ["AgenticContract"]

SWEEP_SHAPE = {"n_steps": 2, "n_worlds": 2, "prompts_per_step": 2, "n_samples": 1}
"""The kill-at-every-await-point law's run: small enough that every point takes well under a second in all."""
LAW_SHAPE = {"n_steps": 2, "n_worlds": 2, "prompts_per_step": 2, "n_samples": 2}
RESCORE_RUBRIC = Rubric(correctness_weight=1.0, efficiency_weight=1.0, tidiness_weight=0.5, name="v2-rescore")
"""The rubric a fork of a finished run re-scores it with (the agentic tutorial's "v2-efficiency" re-weighting)."""


class _RecordingTrainer:
    """Forwards to the fork's trainer and records every payload `update` was sent (step, reward order, lr)."""

    def __init__(self, inner: Any, sent: list[tuple[int, list[str], float]]) -> None:
        self.inner, self.sent = inner, sent

    def update(self, step: int, rewards: Sequence[Reward], lr: float) -> Weights:
        self.sent.append((step, [r.trial_id for r in rewards], lr))
        weights: Weights = self.inner.update(step, rewards, lr)
        return weights

    def weights(self) -> Weights:
        weights: Weights = self.inner.weights()
        return weights

    def info(self) -> TrainerInfo:
        info: TrainerInfo = self.inner.info()
        return info


def _finished(result: Any, what: str) -> AgenticOutcome:
    assert result.ok, f"{what}: the run failed: {type(result.error).__name__}: {result.error}"
    assert isinstance(result.output, AgenticOutcome)
    return result.output


def _assert_each_step_trains_on_the_rest(outcome: AgenticOutcome, lost: frozenset[str], why: str) -> None:
    """Each step of a `LAW_SHAPE` run trained on all of its trials but the `lost` ones."""
    per_step = LAW_SHAPE["prompts_per_step"] * LAW_SHAPE["n_samples"]
    for h in outcome.history:
        n = sum(1 for t in lost if t.startswith(f"s{h.step}-"))
        assert h.n_trials == per_step - n, (
            f"step {h.step} trained on {h.n_trials} trials; want {per_step - n} ({n} {why})"
        )


@tier("agentic")
class AgenticContract(ContractBase):
    """Laws of the durable agentic loop: skipped trials, a judge billed once, re-scoring that re-judges, canonical step
    inputs, exactly-once steps, and resumption from a driver killed anywhere."""

    @pytest.fixture
    def agentic_driver(self) -> AgenticDriver:
        """Return your driver: `async (config, tiers) -> AgenticOutcome`, like `rl.loop.agentic.run_agentic` (ours)."""
        return run_agentic

    @pytest.fixture
    def judge_tier(self) -> JudgeTierFactory:
        """Return `(judge, trace) -> tier`, the tier having `async verify_and_judge(traj, rubric) -> Reward`;
        `trace(fn)` is the durable memo (`@flyte.trace`). Default: ours."""
        return traced_judge_tier

    @pytest.fixture
    def policy_trainer(self) -> TrainerFactory:
        """Return `(world_ids, identity) -> PolicyTrainer` (`update`, `weights`, `info`). Default: `BanditTrainer`."""
        return bandit_trainer

    @pytest.fixture
    def agentic_harness(
        self, agentic_driver: AgenticDriver, judge_tier: JudgeTierFactory, policy_trainer: TrainerFactory
    ) -> Callable[..., AgenticSim]:
        """`harness(seed, **options)`: a fresh simulator with your driver, judge tier and trainer bound in."""
        return partial(AgenticSim, driver=agentic_driver, judge_tier=judge_tier, policy_trainer=policy_trainer)

    def test_agentic_trials_that_fail_every_retry_are_skipped_and_counted(
        self, agentic_harness: Callable[..., AgenticSim], rl_seed: int
    ) -> None:
        """A trial whose sandbox dies on every attempt is skipped and listed, never fatal to its step; every other
        trial is judged, so each step trains on judged + skipped = all of its trials."""
        inputs = {**default_inputs(rl_seed), **LAW_SHAPE}
        trials = all_trial_ids(inputs)
        dead = frozenset({trials[1], trials[-1]})
        outcome = _finished(agentic_harness(rl_seed, dead_trials=dead).run(**LAW_SHAPE), f"dead trials {sorted(dead)}")
        skipped = sorted(s.trial_id for s in outcome.skipped)
        assert skipped == sorted(dead), f"skipped {skipped}; the trials that always fail are {sorted(dead)}"
        _assert_each_step_trains_on_the_rest(outcome, dead, "skipped")

    def test_agentic_judgings_that_fail_every_retry_are_skipped_and_counted(
        self, agentic_harness: Callable[..., AgenticSim], rl_seed: int
    ) -> None:
        """A trial whose judging fails on every attempt is skipped at "verify_and_judge" and listed, never fatal to its
        step; the step trains on the trials that were judged."""
        inputs = {**default_inputs(rl_seed), **LAW_SHAPE}
        trials = all_trial_ids(inputs)
        dead = frozenset({trials[0], trials[-2]})
        outcome = _finished(
            agentic_harness(rl_seed, dead_judgings=dead).run(**LAW_SHAPE), f"judgings of {sorted(dead)} failing"
        )
        skipped = {s.trial_id: s.stage for s in outcome.skipped}
        assert skipped == dict.fromkeys(sorted(dead), "verify_and_judge"), (
            f"skipped {skipped}; the trials whose judging always fails are {sorted(dead)}, at stage verify_and_judge"
        )
        _assert_each_step_trains_on_the_rest(outcome, dead, "not judged")

    def test_agentic_judge_is_billed_once_per_trial_and_rubric(
        self, agentic_harness: Callable[..., AgenticSim], rl_seed: int
    ) -> None:
        """When judging fails after the judge answered (every trial's first attempt), the retry replays the recorded
        answer: the vendor judge bills each (trial, rubric) exactly once."""
        harness = agentic_harness(rl_seed)
        result = harness.run(**LAW_SHAPE, judge_flake_rate=1.0, flaky_trial_rate=0.5)
        _finished(result, "every judging attempt 0 failing after the judge call")
        rubric = default_inputs()["rubric"].name
        billed = {t: harness.judge.billed[(t, rubric)] for t in all_trial_ids({**default_inputs(rl_seed), **LAW_SHAPE})}
        twice = {t: n for t, n in billed.items() if n != 1}
        assert not twice, (
            f"judge billed {twice} times per trial (want exactly once): a judging retry called the vendor again. "
            "Wrap the vendor call in the durable trace (`@flyte.trace`) so a retry replays its answer"
        )

    def test_agentic_train_step_inputs_do_not_depend_on_trial_landing_order(
        self, agentic_harness: Callable[..., AgenticSim], policy_trainer: TrainerFactory, rl_seed: int
    ) -> None:
        """Two runs whose trials land in opposite orders send each train step the same payload (rewards in trial-id
        order), so a replayed step hashes identically and is replayed, not applied again."""
        trials = all_trial_ids({**default_inputs(rl_seed), **LAW_SHAPE})
        rank = {t: i for i, t in enumerate(trials)}
        payloads = []
        for delay in (lambda t: 10.0 * rank[t], lambda t: 10.0 * (len(trials) - rank[t])):
            sent: list[tuple[int, list[str], float]] = []

            def recording(world_ids: Sequence[str], identity: int, sent: list[Any] = sent) -> _RecordingTrainer:
                return _RecordingTrainer(policy_trainer(world_ids, identity), sent)

            harness = agentic_harness(rl_seed, trial_delay_s=delay, policy_trainer=recording)
            _finished(harness.run(**LAW_SHAPE), "trials delayed to land in a chosen order")
            payloads.append(sent)
        assert payloads[0] == payloads[1], (
            f"the train steps were sent {payloads[0]} when trials landed in one order and {payloads[1]} in the other: "
            "sort each step's rewards by trial id before the train step"
        )

    def test_agentic_a_retried_train_step_is_applied_once(
        self, agentic_harness: Callable[..., AgenticSim], rl_seed: int
    ) -> None:
        """A train-step task that fails after the trainer applied the update is retried with the same payload; the
        trainer returns the recorded weights instead of applying the step again, so the run's history equals the
        fault-free run's."""
        clean = _finished(agentic_harness(rl_seed).run(**LAW_SHAPE), "the fault-free run")
        faults = FaultPlan(seed=rl_seed, fail_after_body=frozenset({"trainer.train_step"}))
        retried = _finished(agentic_harness(rl_seed, faults).run(**LAW_SHAPE), "every train step retried")
        for a, b in zip(clean.history, retried.history, strict=True):
            assert a.weights == b.weights, (
                f"step {a.step}: the weights after a retried train step differ from the fault-free run's: the retry "
                "applied the update a second time. Record applied steps in the trainer and return the recorded "
                "weights for a step it has already applied"
            )

    def test_agentic_trainer_refuses_a_step_re_sent_with_another_payload(self, policy_trainer: TrainerFactory) -> None:
        """A step id the trainer applied, re-sent with other rewards, another order of them or another lr, is refused
        with an `rl.errors.LedgerError` and changes nothing: a replay that drifted must fail loudly, never silently
        return the recorded weights (the run would then train on rewards it never applied) or train twice."""
        from rl.errors import LedgerError

        def reward(trial: str, world: str, value: float) -> Reward:
            return Reward(
                trial_id=trial, world_id=world, verified_correct=value > 0, n_turns=2, judge_score=value,
                reward=value, found_doc=0 if value > 0 else None,
            )  # fmt: skip

        worlds = ["w0", "w1"]
        applied = [reward("s0-a", "w0", 1.0), reward("s0-b", "w1", 0.0)]
        for label, payload, lr in (
            ("another reward", [reward("s0-a", "w0", 0.5), applied[1]], 2.0),
            ("the rewards in another order", list(reversed(applied)), 2.0),
            ("another lr", applied, 3.0),
        ):
            trainer = policy_trainer(worlds, 0)
            first = trainer.update(0, applied, 2.0)
            try:
                trainer.update(0, payload, lr)
            except LedgerError:
                pass
            else:
                raise AssertionError(
                    f"step 0 re-sent with {label} was accepted: the trainer must refuse a step id it applied with "
                    "another payload (raise rl.errors.LedgerError, e.g. StepPayloadConflictError), not return the "
                    "recorded weights or apply it again"
                )
            assert trainer.weights() == first, f"refusing step 0 re-sent with {label} changed the weights"

    def test_agentic_a_changed_rubric_re_judges_and_an_unchanged_one_bills_nothing(
        self, agentic_harness: Callable[..., AgenticSim], rl_seed: int
    ) -> None:
        """Forking a finished run with an equal rubric recovers every judgment and bills the judge nothing; forking it
        with a new rubric (re-scoring) calls the judge once for every trial under the new rubric."""
        harness = agentic_harness(rl_seed)
        first = harness.run(**LAW_SHAPE)
        _finished(first, "the first run")
        old = default_inputs()["rubric"]
        billed_first = Counter(harness.judge.billed)
        _finished(harness.rerun(first, rubric=Rubric(**old.model_dump())), "the fork with an equal rubric")
        again = {key: n - billed_first[key] for key, n in harness.judge.billed.items() if n != billed_first[key]}
        assert not again, (
            f"forking the run with an equal rubric billed the judge again {again} (trial, rubric): the judging "
            "actions' inputs changed between runs. Pass judging only the trajectory and the rubric, so a fork "
            "recovers them"
        )
        new = RESCORE_RUBRIC
        _finished(harness.rerun(first, rubric=new), f"the fork with rubric {new.name!r}")
        trials = all_trial_ids({**default_inputs(rl_seed), **LAW_SHAPE})
        unjudged = [t for t in trials if harness.judge.billed[(t, new.name)] == 0]
        assert not unjudged, (
            f"re-scoring with rubric {new.name!r} never called the judge for trials {unjudged}: they kept rubric "
            f"{old.name!r}'s scores. Key the judge's memo on the rubric as well as the trajectory"
        )
        twice = {t: harness.judge.billed[(t, new.name)] for t in trials if harness.judge.billed[(t, new.name)] > 1}
        assert not twice, f"re-scoring with rubric {new.name!r} billed the judge {twice} times per trial (want once)"

    def test_agentic_killed_at_every_await_point_resumes_to_the_uninterrupted_result(
        self, agentic_harness: Callable[..., AgenticSim], rl_seed: int
    ) -> None:
        """Killing the driver at any await point of the tutorial's failure-injected run (flaky trials, judge flakes) and
        retrying it gives the uninterrupted history, every trial judged and billed once, every step applied once on
        one trainer, and untouched parent worlds."""
        points, violations = agentic_sweep(rl_seed, harness=agentic_harness, **SWEEP_SHAPE)
        assert points > 0, f"the uninterrupted run had no await point: {violations}"
        shown = "\n".join(violations[:10]) + (f"\n... and {len(violations) - 10} more" if len(violations) > 10 else "")
        assert not violations, f"{len(violations)} violations over {points} kill points ({SEED_FAILURES}):\n{shown}"
