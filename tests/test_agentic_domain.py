"""The agentic loop's pure parts: world, agent, verifier, judge formula, bandit update; each test quotes its model."""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import subprocess
import sys
from collections.abc import Coroutine
from typing import Any, TypeVar

import pytest
from pydantic import ValidationError

from rl.agentic.agent import doc_order, run_trial
from rl.agentic.bandit import bandit_update, initial_weights
from rl.agentic.faults import FlakyTrials, judge_flakes
from rl.agentic.judge import judge_score, make_reward, verify
from rl.agentic.world import N_DOCS, SECRET_MARKER, doc_path, secret_digest, world_files, world_secret
from rl.deploy.simulated.worlds import MemoryWorlds
from rl.durable.virtual_loop import VirtualTimeLoop
from rl.errors import SandboxFailure
from rl.types import Reward, Rubric, Trajectory, TrialSpec, Turn, Weights, WorldRef

T = TypeVar("T")


def test_world_is_deterministic_and_exactly_one_document_holds_the_hashed_secret():
    """The agentic tutorial: "Each world is a small filesystem of documents; one document contains a (hashed)
    secret"."""
    files = world_files(7, "w1")
    assert files == world_files(7, "w1") and files != world_files(8, "w1")
    holders = [path for path, text in files.items() if SECRET_MARKER in text]
    secret_doc, secret = world_secret(7, "w1")
    assert holders == [doc_path(secret_doc)] and len(files) == N_DOCS
    assert files[doc_path(secret_doc)].endswith(f"{SECRET_MARKER} {hashlib.sha256(secret.encode()).hexdigest()}\n")


def test_doc_order_is_a_permutation_that_follows_a_dominant_prior():
    """The agentic tutorial: "pick documents to read in an order driven by the policy's prior for this world"."""
    rng = random.Random(0)
    assert sorted(doc_order([1.0] * N_DOCS, rng)) == list(range(N_DOCS))
    prior = [1.0] * N_DOCS
    prior[5] = 1e6
    assert all(doc_order(prior, random.Random(s))[0] == 5 for s in range(20))
    with pytest.raises(ValueError, match="positive weights"):
        doc_order([1.0, 0.0], rng)


async def _trial(
    attempt: int, flaky_rate: float, trial_id: str = "s0-p0-n0", latency_s: float = 0.0
) -> tuple[Trajectory, dict[str, str]]:
    store = MemoryWorlds()
    version = store.seal("world-w0", world_files(3, "w0"), "world w0")
    spec = TrialSpec(trial_id=trial_id, step=0, world_id="w0", prompt="find the secret", seed=3)
    fork = store.fork(version, f"world-w0-{trial_id}")
    weights = initial_weights(["w0"])

    class _ForkedTrial:  # the sandbox tier's `generate`, on this one fork
        async def generate(self, spec: TrialSpec, weights: Weights, world: WorldRef) -> Trajectory:
            return await run_trial(spec, weights, fork, tool_latency_s=latency_s)

    flaky = FlakyTrials(_ForkedTrial(), flaky_rate, attempt=lambda: attempt)
    traj = await flaky.generate(spec, weights, WorldRef(world_id="w0", name="world-w0", version=version))
    return traj, fork.written()


def _on_virtual_time(coro: Coroutine[Any, Any, T]) -> T:
    """Run `coro` on the simulator's virtual clock: a tool call's latency costs no wall time and `elapsed_s` (read off
    the running loop's clock) is exact, however loaded the machine is."""
    loop = VirtualTimeLoop()
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.close()


def test_a_retried_trial_regenerates_exactly_the_trajectory_of_its_first_attempt():
    """The agentic tutorial: "the trajectory is seeded by trial_id, so a retry is a clean regeneration, not a replay".

    `elapsed_s` is the one field read off a clock, the running loop's: on the virtual clock it is exactly the tool
    calls' latency on both attempts (on a real loop it would also count however long the machine took).
    """
    first, written = _on_virtual_time(_trial(attempt=0, flaky_rate=0.0, latency_s=0.2))
    retried, _ = _on_virtual_time(_trial(attempt=1, flaky_rate=1.0, latency_s=0.2))
    assert first == retried
    assert first.elapsed_s == round(0.2 * len(first.turns), 2) > 0
    found = [t for t in first.turns if t.found]
    assert (first.answer == secret_digest(3, "w0")) == bool(found) and len(first.turns) <= 6
    assert set(written) == set(first.files_written) and written["answer.txt"] == (first.answer or "")


def test_sandbox_flakes_only_on_attempt_zero():
    """The agentic tutorial: "The flaky_rate parameter injects sandbox failures on attempt 0 so you can watch the
    retries work"."""
    with pytest.raises(SandboxFailure, match="attempt 0"):
        asyncio.run(_trial(attempt=0, flaky_rate=1.0))


def _traj(turns: int, *, answer: str | None, files: list[str], trial_id: str = "t") -> Trajectory:
    return Trajectory(
        trial_id=trial_id,
        world_id="w0",
        weights_version=0,
        turns=[Turn(doc=i, found=i == turns - 1) for i in range(turns)],
        answer=answer,
        files_written=files,
        elapsed_s=0.2 * turns,
        fork_name="f",
        seed=3,
    )


def test_verifier_accepts_only_the_digest_of_the_worlds_secret():
    """The agentic tutorial: "a deterministic verifier checks correctness" (Harbor's test.sh)."""
    assert verify(_traj(2, answer=secret_digest(3, "w0"), files=["answer.txt"]))
    assert not verify(_traj(2, answer="0" * 64, files=["answer.txt"]))
    assert not verify(_traj(6, answer=None, files=["answer.txt"]))


def test_judge_score_is_the_rubric_formula_plus_bounded_seeded_noise():
    """The agentic tutorial: score = w_c·correct + w_e·efficiency + w_t·tidy + U(-0.05, 0.05), efficiency = 1 - (turns -
    1)/N_DOCS."""
    rubric = Rubric()
    tidy = _traj(3, answer=secret_digest(3, "w0"), files=["answer.txt"])
    untidy = _traj(3, answer=secret_digest(3, "w0"), files=["answer.txt", "scratch.tmp"])
    # correct 1.0 + 0.3·(1 - 2/8) + 0.1·1 = 1.325; untidy drops the 0.1 tidiness term.
    assert judge_score(tidy, rubric) == pytest.approx(1.325, abs=0.05 + 1e-9)
    assert judge_score(untidy, rubric) == pytest.approx(1.225, abs=0.05 + 1e-9)
    assert judge_score(tidy, rubric) == judge_score(tidy, rubric)
    reward = make_reward(tidy, True, judge_score(tidy, rubric))
    assert reward.reward == round(1.0 + reward.judge_score, 3) and reward.found_doc == 2 and reward.n_turns == 3


def test_judge_flakes_only_on_attempt_zero_seeded_per_trial():
    """The agentic tutorial: "if attempt == 0 and random.Random(_seed("flake", traj.trial_id)).random() <
    judge_flake_rate"."""
    traj = _traj(1, answer=None, files=["answer.txt"])
    assert judge_flakes(traj, 0, 1.0) and not judge_flakes(traj, 1, 1.0) and not judge_flakes(traj, 0, 0.0)
    rate = sum(judge_flakes(_traj(1, answer=None, files=[], trial_id=f"t{i}"), 0, 0.3) for i in range(1000)) / 1000
    assert 0.25 < rate < 0.35


def _reward(trial_id: str, world: str, doc: int | None, reward: float) -> Reward:
    return Reward(
        trial_id=trial_id,
        world_id=world,
        verified_correct=doc is not None,
        n_turns=1,
        judge_score=reward - 1,
        reward=reward,
        found_doc=doc,
    )


def test_bandit_update_moves_the_prior_toward_rewarded_finds_only():
    """The agentic tutorial: "prior[r["found_doc"]] += lr * r["reward"]  # bandit update toward the rewarded doc"."""
    w0 = initial_weights(["w0", "w1"])
    w1 = bandit_update(w0, [_reward("a", "w0", 3, 2.5), _reward("b", "w1", None, 0.4), _reward("c", "w1", 1, 0.0)], 2.0)
    assert w1.version == 1 and w0.version == 0 and w0.doc_prior["w0"][3] == 1.0  # the input is untouched
    assert w1.doc_prior["w0"][3] == 6.0 and w1.doc_prior["w1"] == [1.0] * N_DOCS
    with pytest.raises(ValueError, match="does not have"):
        bandit_update(w0, [_reward("d", "w9", 0, 1.0)], 2.0)


def test_domain_models_are_frozen():
    """docs/guarantees.md: "Data crossing tier boundaries is immutable": a tier cannot rebind a field of a value it
    received."""
    weights = Weights()
    with pytest.raises(ValidationError):
        weights.version = 3  # type: ignore[misc]


def test_the_agentic_domain_and_driver_import_no_flyte_torch_or_ray():
    """docs/guarantees.md: "Driver logic is plain async functions over protocols, with no flyte import"."""
    modules = [f"rl.agentic.{m}" for m in ("types", "world", "volume_worlds", "agent", "judge", "bandit", "tiers")]
    modules += ["rl.agentic.ray_trainer", "rl.loop.agentic"]
    code = (
        f"import importlib, json, sys\nfor m in {modules!r}: importlib.import_module(m)\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('flyte', 'torch', 'ray', 'vllm'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == []


def test_the_agentic_types_stay_importable_from_rl_agentic_types_as_the_classes_of_rl_types():
    """`rl.agentic.types` still exports each agentic model, and each is the class `rl.types` defines (one home)."""
    import rl.agentic.types
    import rl.types

    for name in rl.agentic.types.__all__:
        assert getattr(rl.agentic.types, name) is getattr(rl.types, name)
        assert getattr(rl.types, name).__module__ == "rl.types"
    assert sorted(rl.agentic.types.__all__) == sorted(
        ["Reward", "Rubric", "StepResult", "TrainerInfo", "Trajectory", "TrialSpec", "Turn", "Weights", "WorldRef"]
    )
