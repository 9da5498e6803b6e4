"""Laws of the rollout buffer (the training-loop tutorial's "Keep rollouts on a volume"): a chain of versions, one
iteration added per version, every version readable later exactly as it was, and re-scoring into a new version that
samples nothing.

There is no tier protocol for reading a buffer, so the laws use the surface of `rl.storage.volumes.VolumeBuffer`, which
yours must have: `append(iteration, rows, *, parent=None) -> version`, `read(version, iterations=None)`,
`iterations(version)`, `versions()` and `rescore(version, reward_fn)`. What each must do, and an example subclass
(`rollout_buffer_factory` returns a factory of fresh buffers): docs/conformance.md#the-rollout-buffers-surface.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rl.conformance.support.contract_base import ContractBase, explicit_examples, law_settings, must_provide, tier
from rl.storage.volumes.buffer import ROLLOUT_FIELDS, rollout_rows
from rl.types import Rollout

__all__ = ["HAZARDOUS_FLOATS", "HAZARDOUS_TEXTS", "RolloutBufferContract", "exact_difference"]

BufferFactory = Callable[[], Any]
Row = dict[str, Any]

HAZARDOUS_FLOATS = (
    0.1,
    1 / 3,
    -0.0,
    5e-324,
    2.2250738585072014e-308,
    1.7976931348623157e308,
    -123456.78901234567,
    2.0**53 + 2,
    1e-7,
)
"""Floats a row format loses when it rounds (`%.12g`, float32, decimal text with too few digits): not exact in
decimal, a signed zero, the smallest subnormal and normal, the largest finite, and integers beyond 2^53."""

HAZARDOUS_TEXTS = ("é", "数学 ∑", "🙂", "line\nbreak", '"quoted" \\ back', "\u2028sep\u2029", "\r\n", "\x00", "")
"""Text a row format mangles: non-ASCII (one, three and four UTF-8 bytes), JSON's escapes, the line separators that
`str.splitlines` (but not a JSONL reader) splits on, a NUL, and the empty string."""


def exact_difference(want: Any, got: Any, where: str = "row") -> str | None:
    """Where `got` differs from `want` (floats bit for bit, so -0.0 is not 0.0; types exactly), or None."""
    if type(want) is not type(got):
        return f"{where} is {got!r} ({type(got).__name__}), appended as {want!r} ({type(want).__name__})"
    if isinstance(want, float):
        if struct.pack("<d", want) != struct.pack("<d", got):
            return f"{where} is {got!r} ({got.hex()}), appended as {want!r} ({want.hex()})"
        return None
    if isinstance(want, dict):
        if set(want) != set(got):
            return f"{where} has the fields {sorted(got)}, appended with {sorted(want)}"
        for key in want:
            found = exact_difference(want[key], got[key], f"{where}[{key!r}]")
            if found:
                return found
        return None
    if isinstance(want, list):
        if len(want) != len(got):
            return f"{where} has {len(got)} items, appended with {len(want)}"
        for i, (w, g) in enumerate(zip(want, got, strict=True)):
            found = exact_difference(w, g, f"{where}[{i}]")
            if found:
                return found
        return None
    return None if want == got else f"{where} is {got!r}, appended as {want!r}"


finite = st.floats(allow_nan=False, allow_infinity=False) | st.sampled_from(HAZARDOUS_FLOATS)
NON_FINITE = (float("inf"), float("-inf"), float("nan"))
"""Rewards no row may hold: the loss cannot train on them, and a NaN-only check lets both infinities through."""
texts = st.text(max_size=12) | st.sampled_from(HAZARDOUS_TEXTS)


@st.composite
def rollouts(draw: st.DrawFn, group_id: int = 0) -> Rollout:
    """One rollout with arbitrary text and arbitrary finite log-probs."""
    n = draw(st.integers(0, 4))
    return Rollout(
        group_id=group_id,
        question=draw(texts),
        answer=draw(texts),
        completion=draw(texts),
        prompt_token_ids=draw(st.lists(st.integers(0, 250_000), max_size=4)),
        token_ids=draw(st.lists(st.integers(0, 250_000), min_size=n, max_size=n)),
        logprobs=draw(st.lists(finite, min_size=n, max_size=n)),
        policy_version=draw(st.integers(0, 1000)),
        seed=draw(st.integers(0, 2**63 - 1)),
    )


@st.composite
def iteration_rows(draw: st.DrawFn, iteration: int) -> list[Row]:
    """One iteration's rows: one to four groups of one to three rollouts, each with a finite reward."""
    rs = [draw(rollouts(group_id=g)) for g in range(draw(st.integers(1, 4))) for _ in range(draw(st.integers(1, 3)))]
    return rollout_rows(iteration, rs, draw(st.lists(finite, min_size=len(rs), max_size=len(rs))))


def hazard_rows(iteration: int) -> list[Row]:
    """Every hazardous float and text, each in some row of one iteration."""
    return rollout_rows(iteration, *hazard_sources())


def hazard_sources() -> tuple[list[Rollout], list[float]]:
    """The rollouts and rewards `hazard_rows` builds its rows from."""
    rs = [
        Rollout(
            group_id=i % 3,
            question=text,
            answer=HAZARDOUS_TEXTS[(i + 1) % len(HAZARDOUS_TEXTS)],
            completion=text * 2,
            prompt_token_ids=[1, 2**31 - 1],
            token_ids=[3, 4],
            logprobs=[-HAZARDOUS_FLOATS[i % len(HAZARDOUS_FLOATS)], -0.0],
            policy_version=i,
            seed=2**63 - 1 - i,
        )
        for i, text in enumerate(HAZARDOUS_TEXTS)
    ]
    return rs, [HAZARDOUS_FLOATS[i % len(HAZARDOUS_FLOATS)] for i in range(len(rs))]


@st.composite
def sourced_rows(draw: st.DrawFn, iteration: int) -> tuple[list[Rollout], list[float]]:
    """The rollouts and rewards of one iteration, as the loop hands them to its rollout buffer."""
    rs = [draw(rollouts(group_id=g)) for g in range(draw(st.integers(1, 4))) for _ in range(draw(st.integers(1, 3)))]
    return rs, draw(st.lists(finite, min_size=len(rs), max_size=len(rs)))


def _row_of(iteration: int, rollout: Rollout, reward: float) -> Row:
    """What a row is (this module's docstring): the rollout's fields, its iteration and its reward, as they are."""
    return {"iteration": iteration, **rollout.to_dict(), "reward": reward}


def simple_rows(iteration: int, n: int = 4) -> list[Row]:
    """`n` plain rows of one iteration: two groups, rewards 1, 0, 1, 0, ..."""
    rs = [
        Rollout(
            group_id=i // 2,
            question=f"q{iteration}-{i // 2}",
            answer=str(i // 2),
            completion=f"completion {i}",
            prompt_token_ids=[1, 2],
            token_ids=[3, 4, 5],
            logprobs=[-0.25, -1.5, -0.125],
            policy_version=iteration,
            seed=1000 * iteration + i,
        )
        for i in range(n)
    ]
    return rollout_rows(iteration, rs, [float(1 - i % 2) for i in range(n)])


def _version_of(result: Any) -> Any:
    return result[0] if isinstance(result, tuple) else result


def _assert_rows(want: Sequence[Row], got: Sequence[Row], what: str) -> None:
    assert len(got) == len(want), f"{what}: {len(got)} rows, appended {len(want)}"
    for i, (w, g) in enumerate(zip(want, got, strict=True)):
        found = exact_difference(w, g, f"row {i}")
        assert found is None, f"{what}: {found}"


@tier("buffer")
class RolloutBufferContract(ContractBase):
    """Laws of the rollout buffer (the surface in this module's docstring): versions never change, rows round-trip
    bit for bit, retried appends are idempotent, a parent is forked as given, missing iterations are visible, and
    re-scoring changes only the rewards, in a new version."""

    @pytest.fixture
    def rollout_buffer_factory(self) -> BufferFactory:
        """Return a zero-argument callable that returns a fresh, empty buffer each call (laws that draw data open one
        per example)."""
        raise must_provide(
            "RolloutBufferContract",
            "rollout_buffer_factory",
            "a zero-argument callable that returns a fresh, empty rollout buffer each call, with append, read, "
            "iterations, versions and rescore as rl.conformance.rollout_buffer_contract describes "
            "(e.g. lambda: VolumeBuffer(LocalVolumeStore(tempfile.mkdtemp(dir=tmp_path)), 'rollouts'))",
        )

    @pytest.fixture
    def rollout_buffer(self, rollout_buffer_factory: BufferFactory) -> Any:
        """One fresh buffer from `rollout_buffer_factory`."""
        return rollout_buffer_factory()

    @law_settings(max_examples=10)
    @given(data=st.data())
    def test_buffer_a_version_reads_later_exactly_as_when_it_was_appended(
        self, rollout_buffer_factory: BufferFactory, data: Any
    ) -> None:
        """After any number of later appends, each version still holds exactly the iterations it held and reads
        exactly the rows it read right after its append: append forks the latest version, never rewrites it."""
        buffer = rollout_buffer_factory()
        count = data.draw(st.integers(2, 4), label="iterations")
        appended: list[tuple[Any, list[int], list[Row]]] = []
        so_far: list[Row] = []
        for iteration in range(count):
            rows = data.draw(iteration_rows(iteration), label=f"iteration {iteration}")
            version = buffer.append(iteration, rows)
            so_far = [*so_far, *rows]
            _assert_rows(so_far, buffer.read(version), f"the version after iteration {iteration}, read right away")
            appended.append((version, list(range(iteration + 1)), so_far))
        for k, (version, iterations, rows) in enumerate(appended):
            held = buffer.iterations(version)
            assert held == iterations, (
                f"the version appended with iteration {k} holds iterations {held} after {count - 1 - k} later "
                f"appends, {iterations} when it was appended: a later append rewrote it. Fork the latest version into "
                "a new one; never change a published version"
            )
            _assert_rows(rows, buffer.read(version), f"the version appended with iteration {k}, read at the end")
        assert len(buffer.versions()) == count, (
            f"{count} appends of new iterations gave {len(buffer.versions())} versions"
        )

    @law_settings(max_examples=15)
    @explicit_examples((7, hazard_sources()))
    @given(case=st.integers(0, 99_999).flatmap(lambda it: st.tuples(st.just(it), sourced_rows(it))))
    def test_buffer_rows_round_trip_bit_for_bit(self, rollout_buffer_factory: BufferFactory, case: Any) -> None:
        """`read` returns every appended row exactly: floats to the bit (1/3, 5e-324, -0.0, 1.8e308), integers
        beyond 2^53, non-ASCII text, JSON escapes and Unicode line separators included; and each row
        (`rl.storage.volumes.rollout_rows`) holds its rollout and reward exactly as the loop handed them over."""
        iteration, (rs, rewards) = case
        rows = rollout_rows(iteration, rs, rewards)
        _assert_rows([_row_of(iteration, r, w) for r, w in zip(rs, rewards, strict=True)], rows, "rollout_rows' rows")
        buffer = rollout_buffer_factory()
        version = buffer.append(iteration, rows)
        _assert_rows(rows, buffer.read(version), f"iteration {iteration} read back")
        _assert_rows(rows, buffer.read(version, [iteration]), f"iteration {iteration} read by number")

    def test_buffer_a_retried_append_returns_the_same_version(self, rollout_buffer: Any) -> None:
        """Appending the rows an iteration already has (a retried task) returns that version and adds none; other rows
        for a held iteration raise and add none (history is rewritten only by forking an earlier version)."""
        version = rollout_buffer.append(1, simple_rows(1))
        again = rollout_buffer.append(1, simple_rows(1))
        assert again == version, f"a retried append of the same rows returned {again!r}, not {version!r}"
        changed = [{**r, "reward": 0.5} for r in simple_rows(1)]
        try:
            rollout_buffer.append(1, changed)
        except Exception:
            pass
        else:
            raise AssertionError(
                "appending different rows for iteration 1, which the buffer already holds, was accepted: a retried "
                "iteration that sampled other rollouts would silently replace the trained ones. Raise instead"
            )
        count = len(rollout_buffer.versions())
        assert count == 1, f"the retried and the refused append left {count} versions, expected 1"
        _assert_rows(simple_rows(1), rollout_buffer.read(version), "iteration 1 after the refused append")

    def test_buffer_append_forks_the_parent_it_is_given(self, rollout_buffer: Any) -> None:
        """`append(it, rows, parent=v)` builds on `v`, not on the latest version: the new version holds `v`'s
        iterations plus `it`, and the versions after `v` are unchanged."""
        v1 = rollout_buffer.append(1, simple_rows(1))
        v2 = rollout_buffer.append(2, simple_rows(2))
        branch = rollout_buffer.append(3, simple_rows(3), parent=v1)
        held = rollout_buffer.iterations(branch)
        assert held == [1, 3], f"append(3, parent=<version of iteration 1>) holds iterations {held}, expected [1, 3]"
        _assert_rows([*simple_rows(1), *simple_rows(3)], rollout_buffer.read(branch), "the branch")
        assert rollout_buffer.iterations(v2) == [1, 2], "appending to an earlier parent changed the later version"

    def test_buffer_missing_iterations_are_visible(self, rollout_buffer: Any) -> None:
        """`iterations` lists exactly what a version holds (a gap shows), and reading an iteration it lacks raises
        `LookupError` naming that iteration, never returns fewer rows in silence."""
        rollout_buffer.append(1, simple_rows(1))
        version = rollout_buffer.append(3, simple_rows(3))
        held = rollout_buffer.iterations(version)
        assert held == [1, 3], f"a version with iterations 1 and 3 lists {held}"
        _assert_rows(simple_rows(3), rollout_buffer.read(version, [3]), "iteration 3 read alone")
        for wanted in ([2], [1, 2]):
            try:
                rows = rollout_buffer.read(version, wanted)
            except LookupError as exc:
                assert "2" in str(exc), f"reading iterations {wanted} raised {exc!r}, which does not name iteration 2"
                continue
            raise AssertionError(
                f"reading iterations {wanted} of a version that holds [1, 3] returned {len(rows)} rows instead of "
                "raising LookupError: a missing iteration must be visible, not an empty read"
            )

    def test_buffer_rescore_changes_only_the_rewards_in_a_new_version(self, rollout_buffer: Any) -> None:
        """`rescore(v, f)` calls `f` once per stored rollout (with that rollout, exactly) and writes a new version whose
        rows are `v`'s with only the reward replaced by `f`'s; `v` itself reads as before."""
        rollout_buffer.append(1, simple_rows(1))
        source = rollout_buffer.append(2, hazard_rows(2))
        original = rollout_buffer.read(source)
        seen: list[Rollout] = []

        def reward_fn(rollout: Rollout) -> float:
            seen.append(rollout)
            return float(len(rollout.completion)) / 3

        new = _version_of(rollout_buffer.rescore(source, reward_fn))
        stored = [Rollout.from_dict({k: row[k] for k in ROLLOUT_FIELDS}) for row in original]
        assert len(seen) == len(stored), f"the reward function was called {len(seen)} times for {len(stored)} rollouts"
        assert sorted(map(repr, seen)) == sorted(map(repr, stored)), (
            "the reward function was not given the stored rollouts exactly (rescoring must score what was stored, "
            "never sample again)"
        )
        assert new != source, "rescore returned the version it scored instead of a new one"
        expected = [{**row, "reward": float(len(row["completion"])) / 3} for row in original]
        _assert_rows(expected, rollout_buffer.read(new), "the rescored version")
        assert rollout_buffer.iterations(new) == rollout_buffer.iterations(source)
        _assert_rows(original, rollout_buffer.read(source), "the source version after rescoring")

    @pytest.mark.parametrize("reward", NON_FINITE, ids=["inf", "-inf", "nan"])
    def test_buffer_refuses_a_non_finite_reward(self, rollout_buffer: Any, reward: float) -> None:
        """A row whose reward is infinite or NaN is refused (`ValueError`) on every way into the buffer, an append and
        a rescore, and adds no version: the buffer only ever holds rows the loss can train on, so nothing reads one
        back. A buffer that checks for NaN only, or checks nothing, fails."""
        source = rollout_buffer.append(1, simple_rows(1))
        bad = simple_rows(2)
        bad[1] = {**bad[1], "reward": reward}
        try:
            rollout_buffer.append(2, bad)
        except ValueError:
            pass
        else:
            raise AssertionError(
                f"a row of iteration 2 with reward {reward!r} was appended: a buffer row's reward is a finite number. "
                "Refuse it with a ValueError naming the row"
            )

        def non_finite(rollout: Rollout) -> float:
            return reward

        try:
            rollout_buffer.rescore(source, non_finite)
        except ValueError:
            pass
        else:
            raise AssertionError(
                f"rescoring with a reward function that returns {reward!r} wrote a version: refuse a non-finite "
                "reward with a ValueError before anything is published"
            )
        count = len(rollout_buffer.versions())
        assert count == 1, f"the refused append and rescore left {count} versions, expected 1"
        _assert_rows(simple_rows(1), rollout_buffer.read(source), "iteration 1 after the refused append and rescore")
