from __future__ import annotations

import subprocess
import sys

import pytest

from rl import platform
from rl.cli import main
from rl.errors import InputError


def test_rl_help_lists_usage(capsys):
    """`rl --help` exits 0 and prints the program's usage."""
    try:
        main(["--help"])
    except SystemExit as exc:
        assert exc.code == 0
    assert "usage: rl" in capsys.readouterr().out


def test_rl_console_script_runs_without_heavy_imports():
    """The CLI entry point imports neither torch nor flyte just to print help."""
    code = (
        "import sys; from rl.cli import build_parser; build_parser(); "
        "print(sorted({'torch', 'flyte'} & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"


def _json_tail(out: str) -> dict:
    import json

    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.heavy
def test_rl_chaos_json_reports_scenarios_failures_rate_and_crash_points(capsys):
    """`rl chaos --json` ends with an object holding the public keys; exit 0 when all invariants hold."""
    assert main(["chaos", "--loop", "grpo-pipelined", "--seeds", "3", "--json"]) == 0
    summary = _json_tail(capsys.readouterr().out)
    assert summary["scenarios"] == 3 and summary["failures"] == 0
    assert summary["crash_points"] > 60 and summary["scenarios_per_s"] > 0


def test_rl_chaos_reports_per_fault_kind_coverage_and_a_trace_explains_one_seed(capsys):
    """Coverage per fault kind in the JSON and the summary; `--seed S --trace` prints scenario, log and digest."""
    assert main(["chaos", "--loop", "grpo", "--seeds", "6", "--no-sweep", "--json"]) == 0
    out = capsys.readouterr().out
    summary = _json_tail(out)
    assert set(summary["exercised"]) >= {"task_failure", "driver_crash", "exhausted_task", "exhausted_driver"}
    assert "scenarios exercising each fault kind:" in out
    assert main(["chaos", "--loop", "agentic", "--seed", "3", "--trace"]) == 0
    out = capsys.readouterr().out
    for needle in ("scenario seed=3", "enabled faults:", "event log:", "driver.start", "final state digest:"):
        assert needle in out
    assert main(["chaos", "--loop", "grpo", "--trace"]) == 2
    assert "--seed" in capsys.readouterr().err


@pytest.mark.heavy
def test_rl_chaos_in_two_processes_reports_what_one_process_does(capsys):
    """Scenarios are seeded and independent: `--jobs 2` changes the speed, never the reports."""
    summaries = []
    for jobs in ("1", "2"):
        assert main(["chaos", "--loop", "agentic", "--seeds", "10", "--no-sweep", "--jobs", jobs, "--json"]) == 0
        summary = _json_tail(capsys.readouterr().out)
        summaries.append({k: summary[k] for k in ("scenarios", "failures", "exercised", "exhausted_then_resumed")})
    assert summaries[0] == summaries[1]
    assert "torn_checkpoint" not in summaries[0]["exercised"]  # the agentic driver keeps no checkpoint


def test_rl_chaos_failure_prints_the_seed_and_the_reproducing_command(capsys, monkeypatch):
    import rl.deploy.simulated.chaos as chaos

    def broken(pipelined, trace=False):
        return lambda seed: chaos.ScenarioReport("grpo", seed, ["iteration 2 was trained 2 times"], 1, 2)

    monkeypatch.setattr(chaos, "grpo_random", broken)
    assert main(["chaos", "--loop", "grpo", "--seed", "7"]) == 1
    out = capsys.readouterr().out
    assert "FAIL seed=7: iteration 2 was trained 2 times" in out
    assert "reproduce: rl chaos --loop grpo --seed 7" in out


@pytest.mark.heavy
def test_rl_bench_json_has_the_public_figures(capsys, monkeypatch):
    import rl.bench.sim as bench

    monkeypatch.setattr(bench, "scenario_speed", lambda **_: {"scenarios_per_s": 1.0})
    monkeypatch.setattr(bench, "parallel_scenario_speed", lambda: {"scenarios_per_s_2_jobs": 2.0})
    assert main(["bench", "--sections", "sim", "--json"]) == 0
    figures = _json_tail(capsys.readouterr().out)
    for key in (
        "replay_ms_per_action",
        "replayed_actions_per_s",
        "pipelined_over_max_gen_train",
        "pipelined_over_sequential",
        "scenarios_per_s",
    ):
        assert key in figures
    assert figures["pipelined_over_max_gen_train"] <= 1.02


def test_the_one_process_chaos_rate_is_repeated_on_seeds_no_earlier_pass_ran(monkeypatch):
    """`rl bench --repeats N`: N timed passes after a warm-up, each on new seeds (a seed run twice would find its
    agentic reference cached and time less work), reported as median and spread; every failing scenario counts."""
    import types

    import rl.bench.sim as bench

    seen: dict[str, list[int]] = {"grpo": [], "agentic": []}

    def report(loop: str, seed: int) -> types.SimpleNamespace:
        seen[loop].append(seed)
        return types.SimpleNamespace(ok=seed != 7)

    monkeypatch.setattr(bench, "grpo_random", lambda pipelined: lambda seed: report("grpo", seed))
    monkeypatch.setattr(bench, "agentic_report", lambda seed: report("agentic", seed))
    figures = bench.scenario_speed(scenarios=3, repeats=2)
    assert seen == {"grpo": list(range(9)), "agentic": list(range(9))}  # warm-up 0-2, then 3-5 and 6-8
    for key in ("scenarios_per_s", "agentic_scenarios_per_s"):
        assert figures[f"{key}_min"] <= figures[key] <= figures[f"{key}_max"]
    assert figures["scenario_failures"] == 2 and figures["scenario_repeats"] == 2  # seed 7, once per loop
    with pytest.raises(InputError, match="repeats must be >= 1"):
        bench.scenario_speed(scenarios=1, repeats=0)


def test_rl_bench_refuses_an_unknown_section(capsys):
    assert main(["bench", "--sections", "sim,gpus"]) == 2
    assert "unknown section" in capsys.readouterr().err


@pytest.mark.heavy
def test_cpu_bench_measures_sampler_ceiling_and_train_step():
    """The CPU section reports the sampler's tokens/s against its teacher-forced ceiling and a full train step."""
    from rl.bench.cpu import cpu_stack_bench

    figures = cpu_stack_bench(groups=2, group_size=2, max_tokens=3, repeats=1)
    assert figures["sampler_tokens_per_s"] > 0 and figures["teacher_forced_tokens_per_s"] > 0
    assert (
        figures["sampler_over_teacher_forced"]
        == figures["sampler_tokens_per_s"] / figures["teacher_forced_tokens_per_s"]
    )
    assert figures["train_step_s"] > 0 and figures["train_step_samples"] == 4


@pytest.mark.heavy
def test_cpu_bench_repeats_each_figure_and_reports_its_median_and_spread():
    """Every timed figure is measured `repeats` times: the median under its name, the min-max beside it; the sampler's
    tokens per CPU-second is reported beside its wall rate."""
    from rl.bench.cpu import cpu_stack_bench

    figures = cpu_stack_bench(groups=2, group_size=2, max_tokens=3, repeats=3)
    assert figures["cpu_repeats"] == 3
    for name in ("sampler_tokens_per_s", "sampler_tokens_per_cpu_s", "teacher_forced_tokens_per_s", "train_step_s"):
        assert 0 < figures[f"{name}_min"] <= figures[name] <= figures[f"{name}_max"], name


def test_cpu_bench_refuses_zero_repeats(capsys):
    from rl.bench.cpu import cpu_stack_bench
    from rl.errors import InputError

    with pytest.raises(InputError, match="repeats must be >= 1"):
        cpu_stack_bench(repeats=0)
    with pytest.raises(SystemExit) as exit_:
        main(["bench", "--sections", "cpu", "--repeats", "0"])
    assert exit_.value.code == 2 and "--repeats" in capsys.readouterr().err


def test_rl_bench_prints_a_repeated_figure_as_median_and_min_max():
    from rl.bench.figures import figure_lines

    figures = {"train_step_s": 0.5, "train_step_s_min": 0.25, "train_step_s_max": 2.0, "cpu_repeats": 5, "x_min": 1.0}
    assert figure_lines(figures) == ["train_step_s  0.5 (0.25-2)", "cpu_repeats   5", "x_min         1"]


@pytest.mark.skipif(platform.bytes_written() is None, reason="this platform counts no written bytes (/proc/self/io)")
def test_rl_bench_volumes_section_compares_a_fork_with_a_full_copy(capsys, monkeypatch):
    """The fork of a world writes (almost) nothing, the full copy writes every byte: both measured in one run."""
    import rl.bench.volumes as volumes_bench

    # The bench sleeps out the racy-mtime window before forking, so that the trial's finalize it times does not
    # re-hash; the bytes counted here are the same without the wait.
    monkeypatch.setattr(volumes_bench.time, "sleep", lambda seconds: None)
    assert main(["bench", "--sections", "volumes", "--world-gib", "0.01", "--json"]) == 0
    figures = _json_tail(capsys.readouterr().out)
    assert figures["volume_copy_bytes_written"] >= figures["volume_size_bytes"]
    assert figures["volume_fork_bytes_written"] < figures["volume_size_bytes"] / 100


@pytest.mark.slow
def test_the_parallel_scenario_rate_runs_every_invariant_on_each_process():
    """`rl bench`'s multi-process chaos rate: real scenarios on spawned processes, none failing."""
    from rl.bench.sim import parallel_scenario_speed

    figures = parallel_scenario_speed(scenarios=3, jobs=2)
    assert figures["parallel_scenario_failures"] == 0
    assert figures["scenarios_per_s_2_jobs"] > 0 and figures["agentic_scenarios_per_s_2_jobs"] > 0


def _imported_simulator(_: int) -> bool:
    import sys

    return all(name in sys.modules for name in ("rl.deploy.simulated.chaos", "rl.deploy.simulated.chaos_agentic"))


@pytest.mark.slow
def test_a_scenario_pools_workers_start_with_the_simulator_already_imported():
    """`rl chaos --jobs N` workers fork from a server that imported the simulator once (where forkserver exists),
    instead of each importing it again on start."""
    import multiprocessing

    from rl.deploy.simulated.scenarios import scenario_pool

    if "forkserver" not in multiprocessing.get_all_start_methods():
        pytest.skip("no forkserver on this platform: workers are spawned and import the simulator themselves")
    with scenario_pool(2) as pool:
        assert pool.map(_imported_simulator, range(2)) == [True, True]
