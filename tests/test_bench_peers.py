"""`nox -s bench-peers`'s pure parts, without TRL: the summary table from records, the orchestrator's flags and order,
and our runner's per-iteration clock. The runners themselves train for real only in that session."""

from __future__ import annotations

import asyncio
import math
import statistics
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

# peers/ is not installed (it is not in the wheel): import it from the checkout. These modules import no peer library.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from peers import bench_trl
from peers.bench_shapes import SHAPES, BenchInputError, IterationClock, RunRecord, bench_prompts
from peers.bench_summary import check_records, format_table, summarise


def _record(impl: str, seed: int, wall: list[float], shape: str = "demo", **kw: object) -> RunRecord:
    n = len(wall)
    fields = {"cpu_s": wall, "gen_tokens": [64] * n, "gen_cpu_s": [0.5] * n, "accuracy": [0.5] * n, **kw}
    return RunRecord(impl=impl, shape=shape, seed=seed, wall_s=wall, peak_rss_mib=400.0, **fields)  # type: ignore[arg-type]


def test_table_of_a_hand_worked_case():
    """Medians, means, rates and the ratio, each computed by hand in the comments."""
    records = [
        # ours, seed 0: steady wall [1, 2, 3] -> median 2; CPU mean 2; tokens 10+20+30=60 over gen CPU 3 -> 20/s
        _record("ours", 0, [9, 1, 2, 3], gen_tokens=[99, 10, 20, 30], gen_cpu_s=[9, 1, 1, 1], accuracy=[1, 0, 0, 0.25]),
        # ours, seed 1: steady wall [2, 4, 6] -> median 4; CPU mean 4; tokens 60 over 6 -> 10/s
        _record("ours", 1, [9, 2, 4, 6], gen_tokens=[99, 10, 20, 30], gen_cpu_s=[9, 2, 2, 2], accuracy=[1, 0, 0, 0.75]),
        # TRL, both seeds: steady wall [1, 1, 1] -> 1; tokens 60 over 0.6 -> 100/s
        *(_record("trl", s, [5, 1, 1, 1], gen_tokens=[9, 20, 20, 20], gen_cpu_s=[9, 0.2, 0.2, 0.2]) for s in (0, 1)),
    ]
    wall, cpu, rate, rss, acc = summarise(records, warmup=1)["demo"]
    # over seeds: wall median(2, 4) = 3 (2-4) against 1 -> ratio 3
    assert (wall.ours.median, wall.ours.low, wall.ours.high, wall.trl.median, wall.ratio) == (3, 2, 4, 1, 3)
    assert (cpu.ours.median, cpu.ratio) == (3, 3)
    assert (rate.ours.median, rate.ours.low, rate.ours.high) == (15, 10, 20)
    assert rate.trl.median == pytest.approx(100) and rate.ratio == pytest.approx(0.15)
    assert (rss.ours.median, rss.ratio) == (400, 1)
    # accuracy over the last tenth of 4 iterations: the last one; median(0.25, 0.75) = 0.5 against 0.5
    assert (acc.ours.median, acc.ours.low, acc.ours.high, acc.ratio) == (0.5, 0.25, 0.75, 1)
    table = format_table("demo", [wall, cpu, rate, rss, acc], seeds=2, iterations=4, warmup=1)
    assert "the first 1 excluded" in table
    assert "| wall s/iter, steady (median) | 3.000 (2.000-4.000) | 1.000 (1.000-1.000) | 3.00 |" in table


@given(st.data())
def test_steady_state_figures_ignore_the_start_up_iterations(data):
    """Whatever the first `warmup` iterations took, the steady-state wall and CPU figures are those of the rest."""
    warmup = data.draw(st.integers(0, 5), label="warmup")
    times = st.floats(0.01, 100, allow_nan=False)
    steady = data.draw(st.lists(times, min_size=1, max_size=12), label="steady")
    startup_a = data.draw(st.lists(times, min_size=warmup, max_size=warmup), label="startup_a")
    startup_b = data.draw(st.lists(times, min_size=warmup, max_size=warmup), label="startup_b")
    trl = _record("trl", 0, [1.0] * (warmup + len(steady)))

    def figures(startup: list[float]) -> tuple[float, float]:
        wall, cpu, *_ = summarise([_record("ours", 0, startup + steady), trl], warmup)["demo"]
        return wall.ours.median, cpu.ours.median

    assert figures(startup_a) == figures(startup_b)
    assert figures(startup_a)[0] == statistics.median(steady)
    assert math.isclose(figures(startup_a)[1], statistics.fmean(steady))


def test_summary_refuses_records_it_cannot_compare():
    """Too few iterations for the warm-up, or a shape only one side ran, is a clear error, not a table."""
    with pytest.raises(BenchInputError, match="lower --warmup"):
        check_records([_record("ours", 0, [1, 1]), _record("trl", 0, [1, 1])], warmup=2)
    with pytest.raises(BenchInputError, match=r"no record from \['trl'\]"):
        check_records([_record("ours", 0, [1, 1])], warmup=0)


def test_a_record_with_lists_of_unequal_lengths_is_refused():
    line = _record("ours", 0, [1.0, 2.0], accuracy=[0.5]).to_json()
    with pytest.raises(BenchInputError, match="unequal lengths"):
        RunRecord.from_json(line)
    with pytest.raises(BenchInputError, match="not a RunRecord"):
        RunRecord.from_json("{not json")


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--seeds", "0"], "--seeds: must be >= 1"),
        (["--iterations", "many"], "expected a whole number, got 'many'"),
        (["--shapes", "demo,huge"], "unknown or no shape(s) ['huge']"),
        (["--shapes", ","], "unknown or no shape(s)"),
        (["--iterations", "4", "--warmup", "4"], "--warmup 4 leaves no steady-state iteration"),
    ],
)
def test_the_orchestrator_refuses_bad_flags_saying_what_to_pass(argv, says, capsys):
    with pytest.raises(SystemExit) as exit_:
        bench_trl.parse_args(argv)
    assert exit_.value.code == 2
    assert says in capsys.readouterr().err


def test_the_orchestrator_interleaves_the_sides_seed_by_seed(monkeypatch, capsys):
    """ours s0, TRL s0, ours s1, TRL s1, one shape after the other; one table per shape."""
    calls = []

    def fake_run(impl: str, shape: str, iterations: int, seed: int) -> RunRecord:
        calls.append((shape, seed, impl))
        return _record(impl, seed, [2.0] * iterations if impl == "ours" else [1.0] * iterations, shape=shape)

    monkeypatch.setattr(bench_trl, "run_one", fake_run)
    assert bench_trl.main(["--seeds", "2", "--iterations", "3", "--shapes", "large,demo"]) == 0
    order = [(s, seed, i) for s in ("large", "demo") for seed in (0, 1) for i in ("ours", "trl")]
    assert calls == order
    out = capsys.readouterr().out
    assert out.index("shape large") < out.index("shape demo")
    assert "| wall s/iter, steady (median) | 2.000 (2.000-2.000) | 1.000 (1.000-1.000) | 2.00 |" in out


def test_a_failing_runner_is_reported_with_the_command_that_reruns_it(monkeypatch, capsys):
    monkeypatch.setitem(bench_trl.RUNNERS, "ours", "peers.no_such_runner")
    assert bench_trl.main(["--seeds", "1", "--iterations", "2", "--shapes", "demo"]) == 9
    err = capsys.readouterr().err
    assert "ours on shape demo, seed 0 exited 1 without a record" in err
    assert "No module named peers.no_such_runner" in err and "rerun it alone:" in err


def test_the_real_model_shape_is_opt_in(monkeypatch):
    """The default run leaves out the minutes-long real-model shape; `--shapes smollm2` runs it alone."""
    assert bench_trl.parse_args([]).shapes == ["demo", "large"]
    assert bench_trl.parse_args(["--shapes", "smollm2"]).shapes == ["smollm2"]
    assert SHAPES["smollm2"].describe() == "4 prompts x 8 samples, 12 new tokens on smollm2"


def test_held_out_accuracy_is_a_row_only_where_every_record_was_evaluated():
    """Held-out accuracy is correct/total per seed: ours 72/288 = 0.25 against TRL 36/288 = 0.125, ratio 2."""
    evaluated = [
        _record("ours", 0, [1, 1], shape="smollm2", heldout_correct=72, heldout_total=288),
        _record("trl", 0, [1, 1], shape="smollm2", heldout_correct=36, heldout_total=288),
    ]
    heldout = summarise(evaluated, warmup=1)["smollm2"][-1]
    assert heldout.label == "held-out accuracy after the last iteration"
    assert (heldout.ours.median, heldout.trl.median, heldout.ratio) == (0.25, 0.125, 2)
    one_side = [evaluated[0], _record("trl", 0, [1, 1], shape="smollm2")]
    assert all(row.label != heldout.label for row in summarise(one_side, warmup=1)["smollm2"])
    again = RunRecord.from_json(evaluated[0].to_json())
    assert (again.heldout_correct, again.heldout_total) == (72, 288)


def test_bench_prompts_repeat_the_digit_task_to_fill_the_large_shape():
    assert len(bench_prompts(8)) == 10 and len(bench_prompts(32)) == 40
    assert {p.question for p in bench_prompts(32)} == {p.question for p in bench_prompts(8)}


def test_our_runner_closes_one_iteration_per_new_trained_row():
    """The reporter wrapper starts the clock on the empty publish, records each new row once, ignores `complete`."""
    from peers.bench_ours import TimedReporter
    from tests.report_rows import rows

    class Sink:
        async def publish(self, history, *, status, evals=()):
            pass

    record = RunRecord(impl="ours", shape="demo", seed=0)
    reporter = TimedReporter(Sink(), IterationClock(), record)
    history = rows(2)

    async def drive() -> None:
        await reporter.publish([], status="running")
        await reporter.publish(history[:1], status="running")
        await reporter.publish(history[:1], status="running")  # a resume republishes: not a new iteration
        await reporter.publish(history, status="running")
        await reporter.publish(history, status="complete")

    asyncio.run(drive())
    assert len(record.wall_s) == len(record.cpu_s) == 2
    assert record.gen_tokens == [round(r.mean_completion_tokens * r.num_rollouts) for r in history]
    assert record.accuracy == [r.task_metrics["accuracy"] for r in history]


def test_our_runner_times_generation_on_the_engine_itself():
    """Every `generate*` coroutine opens and closes the generation window; the engine keeps its type and results."""
    from peers.bench_ours import time_generation

    class Engine:
        async def generate(self, x: int) -> int:
            return x + 1

        async def generate_batch(self, xs: list[int]) -> list[int]:
            return [x + 1 for x in xs]

        def tokenizer(self) -> str:
            return "not timed"

    engine, clock = Engine(), IterationClock()
    time_generation(engine, clock)
    assert type(engine) is Engine and engine.tokenizer() == "not timed"
    assert clock._gen_start is None
    assert asyncio.run(engine.generate(1)) == 2 and clock._gen_start is not None and clock._gen_end is not None
    clock.mark()
    assert asyncio.run(engine.generate_batch([1, 2])) == [2, 3] and clock._gen_start is not None
