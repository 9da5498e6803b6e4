"""Two simulator hooks the agentic driver needs: the driver's own attempt number and the run's name."""

from __future__ import annotations

from rl.durable.attempts import attempt_number, run_name
from rl.durable.durable_sim import DurableSimulator


def test_attempt_number_called_from_driver_code_is_the_driver_attempt():
    """The agentic tutorial: `attempt = int(os.environ.get("FLYTE_ATTEMPT_NUMBER", "0"))` in the driver: the driver is a
    task too."""
    sim = DurableSimulator(seed=1)
    seen: list[int] = []

    async def driver() -> int:
        seen.append(attempt_number())
        if len(seen) == 1:
            raise RuntimeError("simulated driver crash on attempt 0")
        return seen[-1]

    result = sim.run(driver, retries=1)
    assert result.ok and seen == [0, 1]
    assert attempt_number() == 0  # outside any run


def test_run_name_names_the_run_the_code_runs_in_and_is_empty_outside_one():
    """The agentic tutorial: `Volume.new(name=f"world-{world_id}-{flyte.ctx().action.run_name}")` needs the run's
    name."""
    sim = DurableSimulator(seed=2)

    @sim.task
    async def where() -> str:
        return run_name()

    async def driver() -> tuple[str, str]:
        return run_name(), await where()

    first, second = sim.run(driver), sim.run(driver)
    assert first.output == (first.run_id, first.run_id)
    assert second.output == (second.run_id, second.run_id) and first.run_id != second.run_id
    assert run_name() == ""
