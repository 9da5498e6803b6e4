"""The driver's checkpoint on the simulator (`SimCheckpointStore`, the `flyte.ctx().checkpoint` role), where a seeded
fault can tear a write. The checkpoint format and the other stores are in `rl.storage.checkpoint`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rl.durable.supervisor import await_point, crash

if TYPE_CHECKING:
    from rl.durable.kernel import SimKernel


class SimCheckpointStore:
    """The driver's checkpoint (the `flyte.ctx().checkpoint` role): belongs to one run's driver attempts.

    Loads and saves are driver await points. With `atomic=True` (Flyte's behaviour: the blob is uploaded, then
    committed) a torn write leaves the previous checkpoint; with `atomic=False` it leaves the first half of the bytes.
    """

    def __init__(self, sim: SimKernel) -> None:
        self._sim = sim

    async def load(self) -> bytes | None:
        driver = self._sim.require_driver("checkpoint.load")
        await_point(self._sim, driver, "checkpoint.load")
        data = driver.run.checkpoint
        self._sim.log(driver, "checkpoint.load", detail="empty" if data is None else f"{len(data)}B")
        return data

    async def save(self, data: bytes) -> None:
        sim = self._sim
        driver = sim.require_driver("checkpoint.save")
        await_point(sim, driver, "checkpoint.save")
        may_crash = driver.run.crashes < sim.faults.max_driver_crashes
        if may_crash and sim.faults.tear_checkpoint(driver.number, driver.points):
            if not sim.atomic_checkpoints:
                driver.run.checkpoint = bytes(data[: len(data) // 2])
            sim.fired["torn_checkpoint"] += 1
            sim.log(driver, "checkpoint.torn", detail=f"{len(data)}B atomic={sim.atomic_checkpoints}")
            crash(sim, driver, "killed in the middle of a checkpoint write")
        driver.run.checkpoint = bytes(data)
        sim.log(driver, "checkpoint.save", detail=f"{len(data)}B")
