"""The durable simulator reproduces each Flyte semantic the loops rely on; each test quotes the sentence it models."""

from __future__ import annotations

import asyncio
import gc
import logging

import pytest

from rl.deploy.simulated.artifacts import MemoryArtifacts
from rl.durable.attempts import attempt_number
from rl.durable.durable_sim import DurableSimulator
from rl.durable.faults import FaultPlan
from rl.errors import DriverAttemptsExhausted, DriverCrash, SimUsageError, TaskFailed


def _counter_tasks(sim: DurableSimulator):
    calls: list[str] = []

    @sim.task(retries=1)
    async def add(a: int, b: int) -> int:
        calls.append(f"add{a},{b}")
        await asyncio.sleep(1.0)
        return a + b

    @sim.task
    async def train(step: int, rewards: list[float]) -> float:
        calls.append(f"train{step}")
        return sum(rewards) + step

    return add, train, calls


def test_completed_actions_replay_when_the_driver_retries():
    """The agentic tutorial: "completed child actions are not re-executed: the retry replays them from the durable
    record"."""
    sim = DurableSimulator(seed=1)
    add, _train, calls = _counter_tasks(sim)

    async def driver() -> int:
        x = await add(1, 2)
        y = await add(3, 4)
        return x + y

    # Await points: call add#0 (0), return add#0 (1), call add#1 (2): kill at the second call.
    result = sim.run(driver, retries=1, crash_at=2)
    assert result.ok and result.output == 10
    assert result.attempts == 2 and result.crashes == 1
    assert calls == ["add1,2", "add3,4"]
    assert sim.count("action.replayed", "test_completed_actions_replay_when_the_driver_retries.<locals>.driver") == 0
    assert sim.count("action.replayed") == 1


@pytest.mark.parametrize(("canonical", "train_runs"), [(False, 2), (True, 1)])
def test_unsorted_step_inputs_re_execute_the_step_and_sorted_ones_replay(canonical, train_runs):
    """The agentic tutorial: "a driver replay collected the same rewards in a different as_completed order — so the
    training step's inputs hashed differently, the step re-ran instead of replaying"; "the fix is one sorted()"."""
    sim = DurableSimulator(seed=2)
    order_by_attempt = {0: [0.5, 0.1, 0.9], 1: [0.9, 0.5, 0.1]}  # same rewards, another finish order
    ran: list[list[float]] = []

    @sim.task
    async def train(step: int, rewards: list[float]) -> float:
        ran.append(rewards)
        return sum(rewards)

    attempt = {"n": 0}

    async def driver() -> float:
        rewards = order_by_attempt[attempt["n"]]
        attempt["n"] += 1
        out = await train(0, sorted(rewards) if canonical else rewards)
        if attempt["n"] == 1:
            raise RuntimeError("driver died after the step")
        return out

    result = sim.run(driver, retries=1)
    assert result.ok
    assert len(ran) == train_runs


def test_attempt_number_is_visible_to_the_task_and_retries_recover_attempt_zero_faults():
    """The agentic tutorial: "The flaky_rate parameter injects sandbox failures on attempt 0 so you can watch the
    retries work"."""
    sim = DurableSimulator(seed=3)
    seen: list[int] = []

    @sim.task(retries=1)
    async def flaky() -> str:
        seen.append(attempt_number())
        if attempt_number() == 0:
            raise RuntimeError("simulated sandbox failure (attempt 0)")
        return "ok"

    async def driver() -> str:
        return await flaky()

    result = sim.run(driver)
    assert result.output == "ok" and seen == [0, 1]
    assert sim.count("action.retry") == 1


def test_a_task_that_fails_every_attempt_raises_task_failed_to_the_driver():
    """The agentic tutorial: "a trial that fails after retries is skipped, never fatal" — the driver sees a typed
    failure to skip."""
    sim = DurableSimulator(seed=4)

    @sim.task(retries=1)
    async def dead() -> None:
        raise RuntimeError("sandbox gone")

    async def driver() -> str:
        try:
            await dead()
        except TaskFailed as exc:
            return f"skipped after {exc.attempts}"
        return "unreachable"

    assert sim.run(driver).output == "skipped after 2"


def test_traced_call_is_replayed_not_recalled_when_its_task_retries():
    """The agentic tutorial: "If the surrounding task then fails ... the retry replays the recorded result instead of
    calling the judge again"."""
    sim = DurableSimulator(seed=5)
    billed: list[str] = []

    @sim.trace
    async def call_judge(trial: str) -> float:
        billed.append(trial)
        await asyncio.sleep(0.5)
        return 0.7

    @sim.task(retries=2)
    async def verify_and_judge(trial: str) -> float:
        score = await call_judge(trial)
        if attempt_number() == 0:
            raise RuntimeError("post-judge upload failed")
        return score

    async def driver() -> list[float]:
        return [await verify_and_judge("t0"), await verify_and_judge("t1")]

    result = sim.run(driver)
    assert result.output == [0.7, 0.7]
    assert billed == ["t0", "t1"]
    assert sim.count("trace.replayed") == 2


def test_cached_pure_task_returns_its_earlier_result_in_a_later_run():
    """The training-loop tutorial: "Set cache="auto" on steps that are pure, so a rerun of the loop returns finished
    steps from the cache"."""
    sim = DurableSimulator(seed=6)
    built: list[str] = []

    @sim.task(cache=True)
    async def build_world(world_id: str) -> str:
        built.append(world_id)
        return f"world-{world_id}"

    async def driver() -> list[str]:
        return [await build_world("w0"), await build_world("w1")]

    first, second = sim.run(driver), sim.run(driver)
    assert first.output == second.output == ["world-w0", "world-w1"]
    assert built == ["w0", "w1"]
    assert sim.count("action.cached") == 2


def test_checkpoint_belongs_to_one_runs_attempts_and_a_new_run_starts_fresh():
    """The training-loop tutorial: "The checkpoint belongs to the task's attempts within one run, so a new run starts
    from iteration 0"."""
    sim = DurableSimulator(seed=7)
    store = sim.checkpoint_store()
    seen: list[bytes | None] = []

    async def driver() -> None:
        seen.append(await store.load())
        await store.save(b"iteration=3")
        if len(seen) == 1:
            raise RuntimeError("preempted")

    sim.run(driver, retries=1)
    sim.run(driver)
    assert seen == [None, b"iteration=3", None]


def test_non_atomic_torn_checkpoint_leaves_half_the_bytes_and_atomic_keeps_the_old_one():
    """docs/guarantees.md: "Checkpoints are written atomically"; a non-atomic store is modelled too, to test
    detection."""
    for atomic, expected in ((True, b"old"), (False, b"new-chec")):
        assert _torn_write_leaves(atomic) == expected


def _torn_write_leaves(atomic: bool) -> bytes | None:
    sim = DurableSimulator(seed=8, atomic_checkpoints=atomic)
    store = sim.checkpoint_store()
    writes = {"n": 0}

    async def driver() -> bytes | None:
        writes["n"] += 1
        if writes["n"] == 1:
            await store.save(b"old")
            sim.faults = FaultPlan(seed=8, torn_checkpoint_p=1.0, max_driver_crashes=1)
            await store.save(b"new-checkpoint!!")  # torn: the driver dies mid-write
        return await store.load()

    result = sim.run(driver, retries=1)
    assert result.ok and result.crashes == 1
    return result.output  # type: ignore[no-any-return]


def test_rerun_with_recover_reuses_actions_whose_identity_is_unchanged():
    """The agentic tutorial: "Recovery walks the action graph by content-hashed identity: ... every step-0 generate
    action [is] recovered; verify_and_judge re-runs everywhere because its rubric input changed"."""
    sim = DurableSimulator(seed=9)
    ran: list[str] = []

    @sim.task
    async def generate(trial: str) -> str:
        ran.append(f"gen {trial}")
        return f"traj-{trial}"

    @sim.task
    async def judge(traj: str, rubric: str) -> str:
        ran.append(f"judge {traj} {rubric}")
        return f"{traj}:{rubric}"

    async def driver(rubric: str) -> list[str]:
        return [await judge(await generate(t), rubric) for t in ("a", "b")]

    first = sim.run(driver, inputs={"rubric": "v1"})
    ran.clear()
    forked = sim.rerun(first, driver=driver, rubric="v2")
    assert forked.output == ["traj-a:v2", "traj-b:v2"]
    assert ran == ["judge traj-a v2", "judge traj-b v2"]
    assert sim.count("action.recovered", run=forked.run_id) == 2
    with pytest.raises(ValueError, match="did not have"):
        sim.rerun(first, driver=driver, temperature=0.5)


def test_dir_like_inputs_and_outputs_are_copies():
    """The rollouts tutorial: "The weights travel through your object store" — a consumer cannot mutate the producer's
    artifact."""
    sim = DurableSimulator(seed=10)

    @sim.task
    async def produce() -> dict[str, list[int]]:
        return {"weights": [1, 2, 3]}

    @sim.task
    async def consume(weights: dict[str, list[int]]) -> int:
        weights["weights"].append(99)  # a careless consumer
        return len(weights["weights"])

    async def driver() -> tuple[list[int], int]:
        w = await produce()
        n = await consume(w)
        return w["weights"], n

    assert sim.run(driver).output == ([1, 2, 3], 4)


async def _memory_artifacts_copy() -> tuple[bytes, bytes]:
    store = MemoryArtifacts()
    ref = await store.put({"a.bin": b"xyz"}, name="adapter")
    mine = await store.get(ref)
    mine["a.bin"] = b"changed"
    return (await store.get(ref))["a.bin"], ref.digest.encode()


def test_memory_artifacts_get_returns_a_private_copy_with_a_content_digest():
    """docs/guarantees.md: "`flyte.io.Dir` is a copy: a consumer cannot mutate the producer's artifact"."""
    data, digest = asyncio.run(_memory_artifacts_copy())
    assert data == b"xyz" and len(digest) == 32


def test_timeout_stops_a_hung_task_and_the_retry_succeeds():
    """The agentic tutorial: "Each trial is its own task with `retries=1` and a timeout"."""
    sim = DurableSimulator(seed=11)

    @sim.task(retries=1, timeout_s=300)
    async def trial() -> str:
        await asyncio.sleep(10_000 if attempt_number() == 0 else 5)
        return "done"

    async def driver() -> str:
        return await trial()

    result = sim.run(driver)
    assert result.output == "done"
    assert sim.count("action.timeout") == 1
    assert result.virtual_time_s == pytest.approx(305)


def test_virtual_clock_runs_a_five_minute_cold_start_in_no_wall_time_and_overlaps_concurrent_work():
    """docs/guarantees.md: "a 5-minute trainer cold start costs no wall time"; concurrent actions overlap on the virtual
    clock."""
    sim = DurableSimulator(seed=12)

    @sim.task
    async def slow(seconds: float) -> float:
        await asyncio.sleep(seconds)
        return seconds

    async def driver() -> list[float]:
        return list(await asyncio.gather(slow(300.0), slow(120.0), slow(30.0)))

    result = sim.run(driver)
    assert result.output == [300.0, 120.0, 30.0]
    assert result.virtual_time_s == pytest.approx(300.0)


def test_crash_at_every_await_point_resumes_to_the_same_output():
    """docs/guarantees.md: "Killing the driver at any await point and resuming gives the uninterrupted run's adapter,
    optimizer state and history"."""

    def make():
        sim = DurableSimulator(seed=13)
        executed: list[int] = []

        @sim.task
        async def step(i: int) -> int:
            executed.append(i)
            await asyncio.sleep(1 + i)
            return i * i

        async def driver() -> list[int]:
            futs = [asyncio.ensure_future(step(i)) for i in range(3)]
            return [await f for f in futs]

        return sim, driver, executed

    sim, driver, _ = make()
    clean = sim.run(driver)
    assert clean.await_points == 6
    for point in range(clean.await_points):
        sim, driver, executed = make()
        result = sim.run(driver, retries=1, crash_at=point)
        assert result.ok and result.output == clean.output, point
        assert sorted(set(executed)) == [0, 1, 2]


def test_seeded_fault_schedule_mixes_failures_hangs_and_crashes_and_still_completes():
    """The agentic tutorial: the failure-injected run: "Despite a driver crash, a third of sandboxes flaking ... the run
    completed"."""
    plan = FaultPlan(seed=21, task_failure_p=0.3, task_hang_p=0.2, driver_crash_p=0.1)
    sim = DurableSimulator(seed=21, faults=plan)

    @sim.task(retries=2, timeout_s=60)
    async def work(i: int) -> int:
        await asyncio.sleep(1)
        return i + 1

    async def driver() -> list[int]:
        return list(await asyncio.gather(*(work(i) for i in range(20))))

    result = sim.run(driver, retries=plan.max_driver_crashes)
    assert result.output == list(range(1, 21))
    assert sim.count("action.failed") + sim.count("action.timeout") > 0


def _log_of(seed: int) -> list[str]:
    plan = FaultPlan(seed=seed, task_failure_p=0.3, driver_crash_p=0.1)
    sim = DurableSimulator(seed=seed, faults=plan)

    @sim.task(retries=1)
    async def work(i: int) -> int:
        await asyncio.sleep((i * 7919) % 13)
        return i

    async def driver() -> int:
        return sum(await asyncio.gather(*(work(i) for i in range(12))))

    sim.run(driver, retries=3)
    return sim.log_lines()


def test_event_log_is_identical_byte_for_byte_for_the_same_seed():
    """docs/guarantees.md: "A same-seed-twice test proves determinism"."""
    assert _log_of(31) == _log_of(31)
    assert _log_of(31) != _log_of(32)


def test_check_replay_reports_the_first_action_whose_identity_diverges():
    """The agentic tutorial + Temporal's replayer: changed code run against a recorded history names the first divergent
    action."""
    sim = DurableSimulator(seed=40)

    @sim.task
    async def train(step: int, rewards: list[float]) -> float:
        return sum(rewards)

    async def sorted_driver() -> float:
        total = 0.0
        for step in range(3):
            total += await train(step, sorted([0.3, 0.1, 0.2]))
        return total

    async def unsorted_from_step_one() -> float:
        total = 0.0
        for step in range(3):
            rewards = [0.3, 0.1, 0.2]
            total += await train(step, sorted(rewards) if step == 0 else rewards)
        return total

    recorded = sim.run(sorted_driver)
    assert sim.check_replay(recorded, sorted_driver).ok
    report = sim.check_replay(recorded, unsorted_from_step_one)
    assert not report.ok and report.matched == 1
    assert report.divergence is not None and report.divergence.expected == recorded.history[1]
    assert "diverged at action #1" in str(report.divergence)


def test_tasks_called_outside_a_run_are_refused_with_a_clear_error():
    sim = DurableSimulator()

    @sim.task
    async def t() -> int:
        return 1

    with pytest.raises(SimUsageError, match=r"outside DurableSimulator\.run"):
        asyncio.run(t())


def test_driver_crash_cannot_be_swallowed_by_a_broad_except():
    """A killed driver stays dead even if its code catches Exception around the await."""
    sim = DurableSimulator(seed=50)

    @sim.task
    async def t() -> int:
        return 1

    async def driver() -> str:
        try:
            await t()
        except Exception:
            return "swallowed"
        return "ran"

    result = sim.run(driver, crash_at=0)
    assert isinstance(result.error, DriverCrash)


def test_an_action_in_flight_when_the_driver_dies_keeps_running_and_the_retry_attaches_to_it():
    """Flyte's remote controller: a re-submitted action name that exists is monitored ("already exists, continuing
    to monitor"), so a judge call in flight during a driver crash is made once, not twice."""
    sim = DurableSimulator(seed=60)
    started: list[int] = []

    @sim.task
    async def judge(i: int) -> int:
        started.append(i)
        await asyncio.sleep(100)
        return i

    async def driver() -> list[int]:
        futs = [asyncio.ensure_future(judge(i)) for i in range(3)]
        return [await f for f in futs]

    # Points 0..2 are the three calls; kill at the first return (point 3), while two judges are still running.
    result = sim.run(driver, retries=1, crash_at=3)
    assert result.ok and result.output == [0, 1, 2]
    assert sorted(started) == [0, 1, 2]  # each body ran exactly once across both attempts
    assert sim.count("action.attached") + sim.count("action.replayed") == 3


def test_an_action_that_failed_every_retry_replays_its_failure_without_running_again():
    """A failed action keeps its failed outcome: the retried driver sees the same TaskFailed, the body doesn't rerun."""
    sim = DurableSimulator(seed=61)
    runs: list[int] = []

    @sim.task(retries=1)
    async def trial() -> None:
        runs.append(attempt_number())
        raise RuntimeError("sandbox died")

    attempts = {"n": 0}

    async def driver() -> str:
        attempts["n"] += 1
        try:
            await trial()
        except TaskFailed:
            if attempts["n"] == 1:
                raise RuntimeError("driver crashed after the trial failed") from None
            return "skipped"
        return "unreachable"

    result = sim.run(driver, retries=1)
    assert result.output == "skipped"
    assert runs == [0, 1]


def test_actions_orphaned_by_a_crash_are_aborted_when_the_run_ends():
    """A run that finishes without re-issuing an orphaned action doesn't leave it running forever."""
    sim = DurableSimulator(seed=62)

    @sim.task
    async def slow(i: int) -> int:
        await asyncio.sleep(1000)
        return i

    @sim.task
    async def fast() -> int:
        return 0

    calls = {"n": 0}

    async def driver() -> str:
        calls["n"] += 1
        if calls["n"] == 1:
            background = asyncio.ensure_future(slow(1))
            await fast()  # the crash comes at fast's return, while slow runs
            await background
        return "took another path"

    result = sim.run(driver, retries=1, crash_at=[2])  # points: call slow, call fast, return fast
    assert result.output == "took another path"
    assert sim.count("action.aborted") == 1


def test_a_killed_attempts_tasks_are_cancelled_oldest_first_in_every_process():
    """The kill cancels in creation order, not in `asyncio.all_tasks()`'s set order (memory addresses): which exception
    each task of a dead attempt ends with must not differ from one process to the next."""
    sim = DurableSimulator(seed=66)
    unwound: list[int] = []

    @sim.task
    async def step() -> None:
        return None

    async def background(i: int) -> None:
        try:
            await asyncio.sleep(100)
        finally:
            unwound.append(i)

    async def driver() -> None:
        started = [asyncio.ensure_future(background(i)) for i in range(20)]
        await asyncio.sleep(0)  # every background task starts its sleep
        await step()
        await asyncio.gather(*started)

    sim.run(driver, crash_at=0)
    assert unwound == list(range(20))


def test_a_killed_attempts_tasks_leave_no_exception_for_the_garbage_collector_to_report(caplog):
    """Code a kill ends (here a `finally` that calls a task: "attempt is dead") dies silently, as it does with its
    process remotely. asyncio would report its exception from a finalizer at some later collection, and on CPython
    3.11.7 that report can break a concurrent `ast.parse` (see `rl.durable.supervisor.dies_with_the_attempt`)."""
    sim = DurableSimulator(seed=65)

    @sim.task
    async def flush() -> None:
        return None

    async def background() -> None:
        try:
            await asyncio.sleep(100)
        finally:
            await flush()

    async def driver() -> None:
        started = asyncio.ensure_future(background())
        await asyncio.sleep(0)  # background starts its sleep
        await flush()
        await started

    result = sim.run(driver, crash_at=0)
    assert isinstance(result.error, DriverAttemptsExhausted)
    del result
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        gc.collect()
    assert not [r.getMessage() for r in caplog.records if r.name == "asyncio"]
