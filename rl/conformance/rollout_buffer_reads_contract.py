"""The rollout buffer's read law: a non-finite reward stored past `append`'s check never comes back as a row.

`RolloutBufferContract` holds the write side: `append` and `rescore` refuse an infinite or NaN reward. A buffer's
stored rows can still hold one: a file written by an older release, another writer, a hand edit, or a row format
whose parser reads `1e999` as infinity. A buffer that trusts its storage hands that row to the loss, which cannot train
on it, so `read` must check every row it loads as `append` checks every row it stores.

The suite cannot write a row in your storage format, so you bind `plant_rollout_rows(buffer, iteration, rows) ->
version`: store `rows` as `iteration` in a new version of `buffer` (a child of its latest), bypassing every check
`append` makes, as a corrupt or foreign write would (ours: `rl.conformance.bindings.ours.plant_rollout_rows`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest

from rl.conformance.rollout_buffer_contract import NON_FINITE, BufferFactory, simple_rows
from rl.conformance.support.contract_base import ContractBase, must_provide, tier

__all__ = ["PlantRows", "RolloutBufferReadsContract"]

PlantRows = Callable[[Any, int, Sequence[dict[str, Any]]], Any]
"""`(buffer, iteration, rows) -> version`: `rows` stored as `iteration` past every check `append` makes."""


@tier("buffer_reads")
class RolloutBufferReadsContract(ContractBase):
    """The rollout buffer's read law: a stored non-finite reward is refused on `read`."""

    @pytest.fixture
    def rollout_buffer_factory(self) -> BufferFactory:
        """Return a zero-argument callable returning a fresh, empty rollout buffer (as `RolloutBufferContract`)."""
        raise must_provide(
            "RolloutBufferReadsContract",
            "rollout_buffer_factory",
            "a zero-argument callable that returns a fresh, empty rollout buffer "
            "(rl.conformance.rollout_buffer_contract describes its surface)",
        )

    @pytest.fixture
    def plant_rollout_rows(self) -> PlantRows:
        """Return `(buffer, iteration, rows) -> version` writing `rows` as `iteration` in a new version of `buffer`,
        a child of its latest, in the buffer's own format but past every check `append` makes."""
        raise must_provide(
            "RolloutBufferReadsContract",
            "plant_rollout_rows",
            "(buffer, iteration, rows) -> version, storing rows as iteration in a new child version of the buffer's "
            "latest, bypassing append's checks (rl.conformance.bindings.ours.plant_rollout_rows writes ours)",
        )

    @pytest.mark.parametrize("reward", NON_FINITE, ids=["inf", "-inf", "nan"])
    def test_buffer_read_refuses_a_stored_non_finite_reward(
        self, rollout_buffer_factory: BufferFactory, plant_rollout_rows: PlantRows, reward: float
    ) -> None:
        """A version whose stored rows hold an infinite or NaN reward is refused (`ValueError`) by `read`, whole or
        that iteration alone: the buffer never hands the loss a reward it cannot train on. A buffer that checks
        rewards on `append` only, or for NaN only, fails."""
        buffer = rollout_buffer_factory()
        buffer.append(1, simple_rows(1))
        rows = simple_rows(2)
        rows[1] = {**rows[1], "reward": reward}
        planted = plant_rollout_rows(buffer, 2, rows)
        for iterations in (None, [2]):
            try:
                got = buffer.read(planted, iterations)
            except ValueError:
                continue
            bad = [row["reward"] for row in got if row["iteration"] == 2]
            raise AssertionError(
                f"read({'the version' if iterations is None else 'iteration 2'}) returned the stored rows with "
                f"rewards {bad}: a stored reward of {reward!r} would be trained on. Check every row `read` loads as "
                "`append` checks every row it stores, and refuse a non-finite reward with a ValueError naming the row"
            )
