"""The laws of `rl.protocols.CheckpointStore`, the driver's checkpoint: round trips, last write wins, atomic saves."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rl.conformance.support.contract_base import ContractBase, Run, law_settings, must_provide, tier
from rl.protocols import CheckpointStore

__all__ = ["StateStoreContract"]


@tier("state_store")
class StateStoreContract(ContractBase):
    """Laws of `rl.protocols.CheckpointStore`, the driver's checkpoint (the `flyte.ctx().checkpoint` role)."""

    @pytest.fixture
    def state_store(self) -> CheckpointStore:
        """Return a fresh `rl.protocols.CheckpointStore` that nothing has saved to yet (a new one for each test)."""
        raise must_provide(
            "StateStoreContract", "state_store", "a fresh rl.protocols.CheckpointStore nothing has saved to"
        )

    def test_state_store_fresh_store_loads_none(self, state_store: CheckpointStore, rl_run: Run[Any]) -> None:
        """A store nothing was saved to loads None (the driver then starts at iteration 0)."""
        loaded = rl_run(state_store.load())
        assert loaded is None, f"a fresh store loaded {loaded!r}, expected None"

    @law_settings(max_examples=20)
    @given(data=st.data())
    def test_state_store_save_then_load_round_trips_bytes(
        self, state_store: CheckpointStore, rl_run: Run[Any], data: Any
    ) -> None:
        """`load` after `save(blob)` returns exactly `blob` as bytes, empty and binary blobs included."""
        blob = data.draw(st.binary(max_size=4096), label="blob")
        rl_run(state_store.save(blob))
        loaded = rl_run(state_store.load())
        assert type(loaded) is bytes, f"load returned a {type(loaded).__name__}, expected bytes"
        assert loaded == blob, f"saved {len(blob)} bytes, loaded {len(loaded)} different bytes"

    def test_state_store_last_write_wins(self, state_store: CheckpointStore, rl_run: Run[Any]) -> None:
        """After several saves, `load` returns the last one, even when it is shorter than an earlier one."""
        for blob in (b"first checkpoint, the longest of the three", b"second", b"3"):
            rl_run(state_store.save(blob))
        assert rl_run(state_store.load()) == b"3", "load did not return the last saved blob"

    def test_state_store_a_save_cancelled_midway_leaves_the_old_or_the_new_blob(
        self, state_store: CheckpointStore, rl_run: Run[Any]
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
