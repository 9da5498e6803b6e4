"""The exactly-once bandit trainer: an applied-steps ledger that never applies a step twice, nor silently."""

from __future__ import annotations

import pickle

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from rl.agentic.bandit import BanditTrainer, bandit_update, initial_weights
from rl.errors import StepOutOfOrderError, StepPayloadConflictError, TrainerMismatchError
from rl.types import Reward

WORLDS = ["w0", "w1"]


def _reward(trial_id: str, world: str = "w0", doc: int | None = 2, reward: float = 2.3) -> Reward:
    return Reward(
        trial_id=trial_id,
        world_id=world,
        verified_correct=doc is not None,
        n_turns=2,
        judge_score=reward - 1,
        reward=reward,
        found_doc=doc,
    )


def test_re_executing_a_step_returns_the_recorded_weights_without_a_second_update():
    """The agentic tutorial: "A re-executed step task ... gets the recorded result back instead of applying the gradient
    twice"."""
    trainer = BanditTrainer(WORLDS, identity=7)
    batch = [_reward("a"), _reward("b", "w1", 4)]
    first = trainer.update(0, batch, 2.0)
    again = trainer.update(0, batch, 2.0)
    assert again == first and trainer.weights().version == 1
    assert trainer.applications[0] == 1 and trainer.info().applied_steps == [0]


def test_the_same_step_id_with_a_different_payload_raises_instead_of_training_twice():
    """Issue 6: "the same step id with a different payload is an error, not a silent second update"."""
    trainer = BanditTrainer(WORLDS)
    trainer.update(0, [_reward("a")], 2.0)
    for payload, lr in (([_reward("a", reward=1.0)], 2.0), ([_reward("a")], 3.0), ([], 2.0)):
        with pytest.raises(StepPayloadConflictError, match="step 0 was already applied") as caught:
            trainer.update(0, payload, lr)
        assert "sort rewards by trial id" in str(caught.value)
    assert trainer.applications[0] == 1 and trainer.weights().version == 1


def test_the_same_rewards_in_another_order_are_another_payload():
    """The agentic tutorial: "a driver replay collected the same rewards in a different as_completed order" — another
    payload."""
    trainer = BanditTrainer(WORLDS)
    trainer.update(0, [_reward("a"), _reward("b", "w1", 1)], 2.0)
    with pytest.raises(StepPayloadConflictError):
        trainer.update(0, [_reward("b", "w1", 1), _reward("a")], 2.0)


def test_a_step_ahead_of_the_ledger_is_refused():
    """Steps apply in order: step 2 before step 1 would train on weights the driver never saw."""
    trainer = BanditTrainer(WORLDS)
    trainer.update(0, [], 2.0)
    with pytest.raises(StepOutOfOrderError, match="next step to apply is 1"):
        trainer.update(2, [], 2.0)


def test_a_trainer_refuses_to_serve_other_worlds():
    """A name reused for another run's worlds is a clear error, not a prior with missing keys."""
    with pytest.raises(TrainerMismatchError, match="created for worlds"):
        BanditTrainer(WORLDS).check_world_ids(["w0"])


def test_a_payload_conflict_crosses_a_process_boundary_as_itself():
    """The error must survive pickling (a Ray actor or a Flyte task re-raises it in the caller)."""
    err = pickle.loads(pickle.dumps(StepPayloadConflictError(3, "a" * 32, "b" * 32)))
    assert isinstance(err, StepPayloadConflictError) and err.step == 3 and "step 3" in str(err)


class LedgerMachine(RuleBasedStateMachine):
    """The trainer against a model: a list of applied payloads, and weights as the fold of `bandit_update`."""

    def __init__(self) -> None:
        super().__init__()
        self.trainer = BanditTrainer(WORLDS, identity=1)
        self.applied: list[list[Reward]] = []

    @rule(data=st.data())
    def apply_next(self, data: st.DataObject) -> None:
        n = data.draw(st.integers(0, 3))
        batch = [
            _reward(
                f"t{i}", data.draw(st.sampled_from(WORLDS)), data.draw(st.integers(0, 7)), data.draw(st.floats(0, 3))
            )
            for i in range(n)
        ]
        self.trainer.update(len(self.applied), batch, 2.0)
        self.applied.append(batch)

    @precondition(lambda self: self.applied)
    @rule(data=st.data())
    def resend_applied(self, data: st.DataObject) -> None:
        step = data.draw(st.integers(0, len(self.applied) - 1))
        before = self.trainer.weights()
        self.trainer.update(step, self.applied[step], 2.0)
        assert self.trainer.weights() == before

    @precondition(lambda self: self.applied)
    @rule(data=st.data())
    def resend_with_another_payload(self, data: st.DataObject) -> None:
        step = data.draw(st.integers(0, len(self.applied) - 1))
        with pytest.raises(StepPayloadConflictError):
            self.trainer.update(step, [*self.applied[step], _reward("extra")], 2.0)

    @invariant()
    def weights_are_the_fold_of_each_payload_applied_once(self) -> None:
        expected = initial_weights(WORLDS)
        for batch in self.applied:
            expected = bandit_update(expected, batch, 2.0)
        assert self.trainer.weights() == expected
        assert all(self.trainer.applications[s] == 1 for s in range(len(self.applied)))


TestLedgerMachine = LedgerMachine.TestCase
TestLedgerMachine.settings = settings(max_examples=min(settings.default.max_examples, 25), stateful_step_count=8)
