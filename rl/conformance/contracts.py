"""The tier contracts: one base class per protocol, whose tests are that protocol's laws.

Subclass one in a `Test*` class and provide its fixtures; everything else just works:

    class TestMyEngine(RolloutEngineContract):
        @pytest.fixture
        def engine(self, artifacts):
            return MyEngine(artifacts)

        @pytest.fixture
        def adapter(self, artifacts, rl_run):
            return rl_run(MyTrainer(artifacts).init_adapter(0)).adapter

Fixtures you must provide raise `NotImplementedError` and say what to return. Test names are public API: they are
stable across releases, so a fork can select (`-k`), mark or track a law by name.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rl.conformance._base import ContractBase, Run, law_settings, tier
from rl.conformance.capabilities import Capabilities, require
from rl.memory.artifacts import MemoryArtifacts
from rl.protocols import Artifacts, RolloutEngine, Scorer, StateStore, Trainer
from rl.seeding import derive_seed
from rl.types import ArtifactRef, Prompt, Rollout, RolloutRequest, TrainBatch, TrainResult

__all__ = [
    "ArtifactsContract",
    "RolloutEngineContract",
    "ScorerContract",
    "StateStoreContract",
    "TrainerContract",
    "trained_adapter",
]


def must_provide(contract: str, fixture: str, what: str) -> NotImplementedError:
    """The error a required fixture raises until the implementer overrides it."""
    return NotImplementedError(
        f"{contract} needs the `{fixture}` fixture: override it in your test class to return {what}"
    )


# -- Artifacts ---------------------------------------------------------------------------------------------------------

_FILE_NAMES = st.from_regex(r"[a-z][a-z0-9_]{0,7}(\.[a-z]{1,3})?", fullmatch=True)
_FILES = st.dictionaries(_FILE_NAMES, st.binary(max_size=64), min_size=1, max_size=4)
"""Small artifacts: one to four flat files (nesting is exercised once, explicitly, in the private-copy law)."""


def missing_ref(ref: ArtifactRef) -> ArtifactRef:
    """A ref of the same form as `ref` whose digest differs in its last character: stored nowhere."""
    last = ref.digest[-1:]
    digest = ref.digest[:-1] + ("1" if last == "0" else "0")
    uri = ref.uri.replace(ref.digest, digest) if ref.digest in ref.uri else ref.uri + ".missing"
    return ArtifactRef(uri=uri, digest=digest)


@tier("artifacts")
class ArtifactsContract(ContractBase):
    """Laws of `rl.protocols.Artifacts`, the `flyte.io.Dir` role: copies, content addressing, typed absence."""

    @pytest.fixture
    def artifacts(self) -> Artifacts:
        """Return a fresh, empty `rl.protocols.Artifacts` store (a new one for each test)."""
        raise must_provide("ArtifactsContract", "artifacts", "a fresh, empty rl.protocols.Artifacts store")

    def test_artifacts_get_returns_a_private_copy(self, artifacts: Artifacts, rl_run: Run[Any]) -> None:
        """Mutating what `put` was given or what `get` returned never changes the stored artifact."""
        original = {"weights.bin": b"\x00\x01\x02", "sub/config.json": b'{"r": 4}'}
        given_files = dict(original)
        ref = rl_run(artifacts.put(given_files, name="law-private-copy"))
        given_files["weights.bin"] = b"changed after put"
        given_files["extra.txt"] = b"added after put"
        first = rl_run(artifacts.get(ref))
        assert first == original, f"get after put returned {sorted(first)}, expected the files as they were put"
        assert all(type(v) is bytes for v in first.values()), "get must return immutable bytes, not a mutable buffer"
        first["weights.bin"] = b"mutated by the consumer"
        del first["sub/config.json"]
        first["intruder.txt"] = b"added by the consumer"
        second = rl_run(artifacts.get(ref))
        assert second == original, "a consumer's changes to what get returned leaked into the stored artifact"

    @law_settings(max_examples=15)
    @given(data=st.data())
    def test_artifacts_put_is_content_addressed(self, artifacts: Artifacts, rl_run: Run[Any], data: Any) -> None:
        """The same files give the same digest whatever their order or name; different files a different digest."""
        files = data.draw(_FILES, label="files")
        other = data.draw(_FILES.filter(lambda f: f != files), label="other files")
        ref = rl_run(artifacts.put(files, name="law-content-a"))
        reordered = dict(reversed(list(files.items())))
        again = rl_run(artifacts.put(reordered, name="law-content-b"))
        assert again.digest == ref.digest, (
            f"equal files put twice gave digests {ref.digest!r} and {again.digest!r}: put must be content-addressed"
        )
        different = rl_run(artifacts.put(other, name="law-content-c"))
        assert different.digest != ref.digest, f"different files share the digest {ref.digest!r}"
        assert rl_run(artifacts.get(ref)) == files, "get(put(files)) did not return the files"

    def test_artifacts_exists_reports_stored_refs(self, artifacts: Artifacts, rl_run: Run[Any]) -> None:
        """`exists` is True for a ref `put` returned and False for a ref of content never stored."""
        ref = rl_run(artifacts.put({"a.txt": b"present"}, name="law-exists"))
        assert rl_run(artifacts.exists(ref)) is True, f"exists({ref}) is not True right after put returned it"
        absent = missing_ref(ref)
        assert rl_run(artifacts.exists(absent)) is False, f"exists({absent}) is not False for a ref never stored"

    def test_artifacts_get_of_a_missing_ref_raises(self, artifacts: Artifacts, rl_run: Run[Any]) -> None:
        """`get` of a ref this store does not hold raises `FileNotFoundError` (or a subclass), never returns."""
        absent = missing_ref(rl_run(artifacts.put({"a.txt": b"present"}, name="law-missing")))
        with pytest.raises(FileNotFoundError):
            rl_run(artifacts.get(absent))


# -- StateStore --------------------------------------------------------------------------------------------------------


@tier("state_store")
class StateStoreContract(ContractBase):
    """Laws of `rl.protocols.StateStore`, the driver's checkpoint (the `flyte.ctx().checkpoint` role)."""

    @pytest.fixture
    def state_store(self) -> StateStore:
        """Return a fresh `rl.protocols.StateStore` that nothing has saved to yet (a new one for each test)."""
        raise must_provide("StateStoreContract", "state_store", "a fresh rl.protocols.StateStore nothing has saved to")

    def test_state_store_fresh_store_loads_none(self, state_store: StateStore, rl_run: Run[Any]) -> None:
        """A store nothing was saved to loads None (the driver then starts at iteration 0)."""
        loaded = rl_run(state_store.load())
        assert loaded is None, f"a fresh store loaded {loaded!r}, expected None"

    @law_settings(max_examples=20)
    @given(data=st.data())
    def test_state_store_save_then_load_round_trips_bytes(
        self, state_store: StateStore, rl_run: Run[Any], data: Any
    ) -> None:
        """`load` after `save(blob)` returns exactly `blob` as bytes, empty and binary blobs included."""
        blob = data.draw(st.binary(max_size=4096), label="blob")
        rl_run(state_store.save(blob))
        loaded = rl_run(state_store.load())
        assert type(loaded) is bytes, f"load returned a {type(loaded).__name__}, expected bytes"
        assert loaded == blob, f"saved {len(blob)} bytes, loaded {len(loaded)} different bytes"

    def test_state_store_last_write_wins(self, state_store: StateStore, rl_run: Run[Any]) -> None:
        """After several saves, `load` returns the last one, even when it is shorter than an earlier one."""
        for blob in (b"first checkpoint, the longest of the three", b"second", b"3"):
            rl_run(state_store.save(blob))
        assert rl_run(state_store.load()) == b"3", "load did not return the last saved blob"

    def test_state_store_a_save_cancelled_midway_leaves_the_old_or_the_new_blob(
        self, state_store: StateStore, rl_run: Run[Any]
    ) -> None:
        """A save cancelled at any of its await points (the driver killed mid-checkpoint) leaves exactly the previous
        blob or exactly the new one, never a truncated or mixed write: save atomically (write aside, then rename)."""
        old, new = b"old checkpoint " * 64, b"new checkpoint, longer than the old one " * 256

        async def cancel_after(steps: int) -> bytes | None:
            await state_store.save(old)
            saving = asyncio.ensure_future(state_store.save(new))
            for _ in range(steps):
                await asyncio.sleep(0)
            saving.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await saving
            return await state_store.load()

        for steps in range(12):
            loaded = rl_run(cancel_after(steps))
            assert loaded in (old, new), (
                f"a save cancelled after {steps} scheduler steps left {len(loaded or b'')} bytes that are neither the "
                f"previous blob ({len(old)} bytes) nor the new one ({len(new)} bytes): the store writes in place"
            )


# -- RolloutEngine -----------------------------------------------------------------------------------------------------


def _describe_difference(a: Sequence[Rollout], b: Sequence[Rollout]) -> str:
    if len(a) != len(b):
        return f"{len(a)} rollouts, then {len(b)}"
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        dx, dy = x.to_dict(), y.to_dict()
        for key in dx:
            if dx[key] != dy[key]:
                return f"rollout {i} differs in {key}: {dx[key]!r} then {dy[key]!r}"
    return "no difference"


@tier("engine")
class RolloutEngineContract(ContractBase):
    """Laws of `rl.protocols.RolloutEngine`: seeded, labelled groups with the sampling log-prob of every token.

    Provide `engine` and `adapter`; `artifacts` (the store both share) defaults to an in-memory store, and `prompt` and
    `rollout_request` can be overridden when your engine needs another prompt or group size.
    """

    @pytest.fixture
    def artifacts(self) -> Artifacts:
        """The artifact store `engine` and `adapter` share; defaults to an in-memory store (override to use yours)."""
        return MemoryArtifacts()

    @pytest.fixture
    def engine(self) -> RolloutEngine:
        """Return the `rl.protocols.RolloutEngine` under test, able to sample from the `adapter` fixture's adapter."""
        raise must_provide(
            "RolloutEngineContract",
            "engine",
            "the RolloutEngine under test, reading adapters from the `artifacts` fixture's store",
        )

    @pytest.fixture
    def adapter(self) -> ArtifactRef:
        """Return the `ArtifactRef` of a version-0 adapter `engine` can sample from, stored in the `artifacts` fixture's
        store (e.g. `rl_run(MyTrainer(artifacts).init_adapter(0)).adapter`)."""
        raise must_provide(
            "RolloutEngineContract",
            "adapter",
            "the ArtifactRef of a version-0 adapter the engine can sample, e.g. "
            "rl_run(trainer.init_adapter(0)).adapter on the `artifacts` store",
        )

    @pytest.fixture
    def prompt(self) -> Prompt:
        """The prompt the laws sample from; defaults to the digit task's `Prompt("3=", "4")`."""
        return Prompt(question="3=", answer="4")

    @pytest.fixture
    def rollout_request(self, prompt: Prompt, adapter: ArtifactRef, rl_seed: int) -> RolloutRequest:
        """The request the laws send: group 3 of 8 samples, labelled policy version 2 (so defaults cannot pass)."""
        return RolloutRequest(
            group_id=3,
            prompt=prompt,
            n=8,
            adapter=adapter,
            policy_version=2,
            seed=derive_seed("conformance.engine", rl_seed),
            max_tokens=4,
        )

    @pytest.fixture
    def other_adapter(self) -> ArtifactRef:
        """Return the `ArtifactRef` of a second adapter, stored in the `artifacts` store, whose samples differ from the
        `adapter` fixture's for the same request (e.g. the adapter after a few training steps; note that a fresh LoRA
        adapter's B matrix is zero, so two version-0 adapters sample alike)."""
        raise must_provide(
            "RolloutEngineContract",
            "other_adapter",
            "the ArtifactRef of a second adapter that samples differently from `adapter` (e.g. one a few training "
            "steps on), stored in the `artifacts` store",
        )

    def test_engine_same_request_gives_same_rollouts(
        self, engine: RolloutEngine, rollout_request: RolloutRequest, rl_run: Run[Any]
    ) -> None:
        """A retried request returns identical rollouts, even after the engine served another request in between."""
        first = rl_run(engine.generate(rollout_request))
        other = replace(rollout_request, group_id=0, seed=derive_seed("conformance.engine.other", rollout_request.seed))
        rl_run(engine.generate(other))
        again = rl_run(engine.generate(rollout_request))
        assert first == again, f"the same request gave different rollouts: {_describe_difference(first, again)}"

    def test_engine_group_has_n_rollouts_labelled_with_the_request(
        self, engine: RolloutEngine, rollout_request: RolloutRequest, rl_run: Run[Any]
    ) -> None:
        """A group has exactly `n` rollouts, each carrying the request's group id, policy version, seed and prompt."""
        group = rl_run(engine.generate(rollout_request))
        req = rollout_request
        assert len(group) == req.n, f"the engine returned {len(group)} rollouts for n={req.n}"
        for i, r in enumerate(group):
            assert r.group_id == req.group_id, f"rollout {i} has group_id {r.group_id}, the request {req.group_id}"
            assert r.policy_version == req.policy_version, (
                f"rollout {i} has policy_version {r.policy_version}, the request {req.policy_version}"
            )
            assert r.seed == req.seed, f"rollout {i} has seed {r.seed}, the request {req.seed}"
            assert (r.question, r.answer) == (req.prompt.question, req.prompt.answer), (
                f"rollout {i} carries prompt {(r.question, r.answer)!r}, the request {req.prompt!r}"
            )

    def test_engine_logprobs_are_one_finite_nonpositive_value_per_token(
        self, engine: RolloutEngine, rollout_request: RolloutRequest, rl_run: Run[Any]
    ) -> None:
        """Every rollout records one sampling log-probability per token id, each finite and at most 0."""
        for i, r in enumerate(rl_run(engine.generate(rollout_request))):
            assert len(r.logprobs) == len(r.token_ids), (
                f"rollout {i} has {len(r.token_ids)} token ids but {len(r.logprobs)} log-probs"
            )
            for t, lp in enumerate(r.logprobs):
                assert math.isfinite(lp) and lp <= 0.0, (
                    f"rollout {i}, token {t}: log-prob {lp!r} is not finite and <= 0"
                )

    def test_engine_samples_within_a_group_differ(
        self,
        engine: RolloutEngine,
        rollout_request: RolloutRequest,
        capabilities: Capabilities,
        rl_run: Run[Any],
    ) -> None:
        """The `n` samples of one group are independent draws, not `n` copies of one completion."""
        require(capabilities, "distinct_samples_within_group", "samples of a group differ")
        group = rl_run(engine.generate(rollout_request))
        distinct = {tuple(r.token_ids) for r in group}
        assert len(distinct) > 1, (
            f"all {len(group)} samples of the group are the same completion {group[0].completion!r}"
        )

    def test_engine_different_seeds_give_different_groups(
        self,
        engine: RolloutEngine,
        rollout_request: RolloutRequest,
        capabilities: Capabilities,
        rl_run: Run[Any],
    ) -> None:
        """Two requests that differ only in their seed sample different groups: the seed reaches the sampler."""
        require(capabilities, "distinct_groups_across_seeds", "different seeds give different groups")
        a = rl_run(engine.generate(rollout_request))
        b = rl_run(
            engine.generate(replace(rollout_request, seed=derive_seed("conformance.reseed", rollout_request.seed)))
        )
        assert [r.token_ids for r in a] != [r.token_ids for r in b], (
            "requests differing only in their seed sampled the same group: the engine ignores the seed"
        )

    def test_engine_serves_the_adapter_each_request_names(
        self, engine: RolloutEngine, rollout_request: RolloutRequest, other_adapter: ArtifactRef, rl_run: Run[Any]
    ) -> None:
        """Each request is sampled from the adapter it names, whatever the engine served before: two requests that
        differ only in their adapter (same policy-version label, same seed) give different groups, in either order."""
        other = replace(rollout_request, adapter=other_adapter)
        first_other = rl_run(engine.generate(other))
        mine = rl_run(engine.generate(rollout_request))
        assert [r.token_ids for r in mine] != [r.token_ids for r in first_other], (
            f"a request for adapter {rollout_request.adapter.digest[:12]} returned the same group as the previous "
            f"request for adapter {other_adapter.digest[:12]} (both labelled policy version "
            f"{rollout_request.policy_version}): the engine served a stale adapter. Key a loaded adapter by its "
            "digest, never by its version label or name"
        )
        again = rl_run(engine.generate(other))
        assert again == first_other, (
            f"the request for adapter {other_adapter.digest[:12]} changed after another adapter was served: "
            f"{_describe_difference(first_other, again)}"
        )


# -- Scorer ------------------------------------------------------------------------------------------------------------

_COMPLETIONS = ("####4", "4", "####5", "the answer is 7", "", "#### 4", "45", "####four")


def default_scorer_group() -> list[Rollout]:
    """Eight completions of the digit task's "3=" (answer "4") that the seed's reward scores differently."""
    return [
        Rollout(
            group_id=0,
            question="3=",
            answer="4",
            completion=c,
            prompt_token_ids=[2, 7, 10],
            token_ids=[ord(ch) % 50 for ch in c] or [1],
            logprobs=[-1.0] * max(len(c), 1),
            policy_version=0,
            seed=0,
        )
        for c in _COMPLETIONS
    ]


@tier("scorer")
class ScorerContract(ContractBase):
    """Laws of `rl.protocols.Scorer`: one finite reward per rollout, in the rollouts' order."""

    @pytest.fixture
    def scorer(self) -> Scorer:
        """Return the `rl.protocols.Scorer` under test."""
        raise must_provide("ScorerContract", "scorer", "the rl.protocols.Scorer under test")

    @pytest.fixture
    def scorer_group(self) -> list[Rollout]:
        """The group the laws score; defaults to `default_scorer_group()` (override for a scorer that needs others)."""
        return default_scorer_group()

    def test_scorer_returns_one_finite_reward_per_rollout(
        self, scorer: Scorer, scorer_group: list[Rollout], rl_run: Run[Any]
    ) -> None:
        """`score_group` returns as many rewards as rollouts, each a finite real number."""
        rewards = rl_run(scorer.score_group(scorer_group))
        assert len(rewards) == len(scorer_group), f"{len(rewards)} rewards for {len(scorer_group)} rollouts"
        for i, r in enumerate(rewards):
            assert isinstance(r, int | float) and not isinstance(r, bool), f"reward {i} is a {type(r).__name__}"
            assert math.isfinite(r), f"reward {i} ({scorer_group[i].completion!r}) is {r!r}, not finite"

    @law_settings(max_examples=10)
    @given(data=st.data())
    def test_scorer_permuting_a_group_permutes_its_rewards(
        self, scorer: Scorer, scorer_group: list[Rollout], rl_run: Run[Any], data: Any
    ) -> None:
        """Scoring a permuted group returns the same rewards permuted the same way (rewards follow their rollouts)."""
        order = data.draw(st.permutations(range(len(scorer_group))), label="order")
        base = rl_run(scorer.score_group(scorer_group))
        permuted = rl_run(scorer.score_group([scorer_group[i] for i in order]))
        expected = [base[i] for i in order]
        assert permuted == expected, f"scoring the group in order {order} gave {permuted}, expected {expected}"


# -- Trainer -----------------------------------------------------------------------------------------------------------

_REWARD_PATTERN = (1.0, 0.0, 0.5, 0.0)


def _rewards_with_signal(rollouts: Sequence[Rollout]) -> list[float]:
    """Rewards that differ within every group of two or more, so every group carries a training signal."""
    seen: dict[int, int] = {}
    rewards = []
    for r in rollouts:
        position = seen.get(r.group_id, 0)
        seen[r.group_id] = position + 1
        rewards.append(_REWARD_PATTERN[position % len(_REWARD_PATTERN)])
    return rewards


def _digests(result: TrainResult) -> Mapping[str, str]:
    return {"adapter": result.adapter.digest, "optimizer state": result.optimizer_state.digest}


def digit_groups(
    engine: RolloutEngine, adapter: ArtifactRef, policy_version: int, seed: int, run: Run[Any]
) -> list[Rollout]:
    """Two groups of four rollouts of the digit task (prompts "3=" and "7="), sampled by `engine` from `adapter`."""
    rollouts: list[Rollout] = []
    for gid, prompt in enumerate((Prompt("3=", "4"), Prompt("7=", "8"))):
        request = RolloutRequest(
            group_id=gid,
            prompt=prompt,
            n=4,
            adapter=adapter,
            policy_version=policy_version,
            seed=derive_seed("conformance.rollouts", seed, gid),
            max_tokens=4,
        )
        rollouts.extend(run(engine.generate(request)))
    return rollouts


def trained_adapter(engine: RolloutEngine, trainer: Trainer, seed: int, run: Run[Any], steps: int = 3) -> ArtifactRef:
    """The adapter after `steps` training steps on groups `engine` samples (digit-task prompts, rewards with signal in
    every group): a second adapter for the engine laws, one that samples differently from version 0."""
    state = run(trainer.init_adapter(derive_seed("conformance.other-adapter", seed)))
    for step in range(steps):
        rollouts = digit_groups(engine, state.adapter, step, derive_seed("conformance.other-adapter", seed, step), run)
        batch = TrainBatch(
            step=step,
            rollouts=rollouts,
            rewards=_rewards_with_signal(rollouts),
            adapter=state.adapter,
            optimizer_state=state.optimizer_state,
            new_version=step + 1,
        )
        state = run(trainer.train_step(batch))
    return state.adapter


@tier("trainer")
class TrainerContract(ContractBase):
    """Laws of `rl.protocols.Trainer`: a seeded init and a step that is a pure function of its batch.

    Provide `trainer` and an `engine` that samples from its adapters (it builds the training batch), or override
    `training_rollouts` to build the batch's rollouts yourself. `artifacts` defaults to an in-memory store.
    """

    @pytest.fixture
    def artifacts(self) -> Artifacts:
        """The artifact store `trainer` and `engine` share; defaults to an in-memory store (override to use yours)."""
        return MemoryArtifacts()

    @pytest.fixture
    def trainer(self) -> Trainer:
        """Return the `rl.protocols.Trainer` under test, storing its adapters in the `artifacts` fixture's store."""
        raise must_provide(
            "TrainerContract", "trainer", "the Trainer under test, storing adapters in the `artifacts` fixture's store"
        )

    @pytest.fixture
    def engine(self) -> RolloutEngine:
        """Return a `RolloutEngine` that samples from the trainer's adapters (it builds the training batch), or override
        `training_rollouts` instead."""
        raise must_provide(
            "TrainerContract",
            "engine",
            "a RolloutEngine that samples from the trainer's adapters in the `artifacts` store "
            "(or override `training_rollouts`)",
        )

    @pytest.fixture
    def trainer_version0(self, trainer: Trainer, rl_seed: int, rl_run: Run[Any]) -> TrainResult:
        """The trainer's version-0 adapter and optimizer state: `init_adapter` of a seed derived from `rl_seed`."""
        return rl_run(trainer.init_adapter(derive_seed("conformance.trainer.init", rl_seed)))

    @pytest.fixture
    def training_rollouts(
        self, engine: RolloutEngine, trainer_version0: TrainResult, rl_seed: int, rl_run: Run[Any]
    ) -> list[Rollout]:
        """Two groups of four rollouts sampled by `engine` from the version-0 adapter (prompts "3=" and "7=")."""
        return digit_groups(
            engine, trainer_version0.adapter, 0, derive_seed("conformance.trainer.rollouts", rl_seed), rl_run
        )

    @pytest.fixture
    def train_batch(self, trainer_version0: TrainResult, training_rollouts: list[Rollout]) -> TrainBatch:
        """Step 0 from version 0 to version 1, with rewards that differ within every group (every group has signal)."""
        return TrainBatch(
            step=0,
            rollouts=list(training_rollouts),
            rewards=_rewards_with_signal(training_rollouts),
            adapter=trainer_version0.adapter,
            optimizer_state=trainer_version0.optimizer_state,
            new_version=1,
        )

    def test_trainer_init_adapter_is_deterministic_in_its_seed(
        self, trainer: Trainer, rl_seed: int, rl_run: Run[Any]
    ) -> None:
        """`init_adapter(seed)` twice gives the same version-0 artifacts; another seed gives another adapter."""
        seed = derive_seed("conformance.trainer.init", rl_seed)
        a, b = rl_run(trainer.init_adapter(seed)), rl_run(trainer.init_adapter(seed))
        assert a.version == 0, f"init_adapter returned version {a.version}, expected 0"
        assert _digests(a) == _digests(b), f"init_adapter({seed}) twice gave {_digests(a)} and {_digests(b)}"
        c = rl_run(trainer.init_adapter(derive_seed("conformance.trainer.init.other", rl_seed)))
        assert c.adapter.digest != a.adapter.digest, "init_adapter gave the same adapter for two different seeds"

    def test_trainer_train_step_returns_version_new_version(
        self, trainer: Trainer, train_batch: TrainBatch, rl_run: Run[Any]
    ) -> None:
        """`train_step(batch)` returns an adapter labelled `batch.new_version`."""
        result = rl_run(trainer.train_step(train_batch))
        assert result.version == train_batch.new_version, (
            f"train_step returned version {result.version} for a batch with new_version {train_batch.new_version}"
        )

    def test_trainer_replaying_a_batch_is_bitwise_identical(
        self, trainer: Trainer, train_batch: TrainBatch, capabilities: Capabilities, rl_run: Run[Any]
    ) -> None:
        """Training the same batch twice gives bitwise-identical adapter and optimizer-state digests."""
        require(capabilities, "bitwise_replay", "replaying a batch is bitwise identical")
        first = rl_run(trainer.train_step(train_batch))
        again = rl_run(trainer.train_step(train_batch))
        assert _digests(first) == _digests(again), (
            f"the same batch trained twice gave {_digests(first)} and then {_digests(again)}"
        )

    def test_trainer_step_uses_the_optimizer_state_it_is_given(
        self, trainer: Trainer, train_batch: TrainBatch, rl_run: Run[Any]
    ) -> None:
        """The optimizer state travels with the batch: the second step from version 1 with version 1's optimizer state
        differs from the same step restarted from version 0's (fresh) optimizer state. A trainer that builds a fresh
        optimizer every step, or keeps it in its process, loses the moments on every task retry or move."""
        v1 = rl_run(trainer.train_step(train_batch))
        assert v1.optimizer_state is not None, "train_step returned no optimizer state; the next step needs it"
        second = replace(train_batch, step=1, adapter=v1.adapter, optimizer_state=v1.optimizer_state, new_version=2)
        carried = rl_run(trainer.train_step(second))
        restarted = rl_run(trainer.train_step(replace(second, optimizer_state=train_batch.optimizer_state)))
        assert carried.adapter.digest != restarted.adapter.digest, (
            "step 1 gave the same adapter with version 1's optimizer state as with version 0's: the trainer ignores "
            "the batch's optimizer_state (a fresh optimizer every step, or one kept in the process)"
        )

    def test_trainer_step_changes_the_adapter(
        self, trainer: Trainer, train_batch: TrainBatch, rl_run: Run[Any]
    ) -> None:
        """A step on a batch with signal in every group returns an adapter different from the one it trained."""
        result = rl_run(trainer.train_step(train_batch))
        assert result.adapter.digest != train_batch.adapter.digest, "a step with signal left the adapter unchanged"
