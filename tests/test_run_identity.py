"""What a run records is part of its identity: a resume that would leave holes in the rollout buffer is refused, a
configuration mismatch names the fields that differ, and `rl rescore` refuses a buffer with holes (issue 16, item 3)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rl.cli import main
from rl.deploy.simulated.artifacts import MemoryArtifacts
from rl.deploy.simulated.grpo_tiers import MemoryEngine, MemoryScorer, MemoryTrainer
from rl.errors import CheckpointConfigMismatchError
from rl.loop.grpo import GrpoConfig, GrpoTiers, run_grpo
from rl.problems import DigitSuccessor
from rl.storage.checkpoint.format import DriverState, encode_state
from rl.storage.checkpoint.memory_store import MemoryCheckpointStore
from rl.storage.volumes.buffer import VolumeBuffer, rollout_rows
from rl.storage.volumes.rollout_buffer import BUFFER_NAME
from rl.storage.volumes.store import LocalVolumeStore
from rl.types import ArtifactRef, Rollout

CONFIG = GrpoConfig(iterations=4, prompts_per_iteration=2, group_size=2, seed=5, evaluate=False)


class _Crash(RuntimeError):
    pass


class _ListBuffer:
    """A rollout buffer in memory: the iterations appended, and a version string per append."""

    def __init__(self) -> None:
        self.iterations: list[int] = []

    async def append(self, iteration, rollouts, rewards, parent):
        self.iterations.append(iteration)
        return f"v{len(self.iterations)}"


class _CrashingScorer(MemoryScorer):
    """Scores until iteration `crash_at`, then raises: the driver dies with iterations 0..crash_at-1 checkpointed."""

    def __init__(self, crash_at: int) -> None:
        super().__init__()
        self.crash_at = crash_at

    async def score_group(self, rollouts):
        if rollouts[0].policy_version >= self.crash_at:
            raise _Crash
        return await super().score_group(rollouts)


def _tiers(artifacts, *, buffer, scorer=None) -> GrpoTiers:
    return GrpoTiers(
        engine=MemoryEngine(artifacts),
        scorer=scorer or MemoryScorer(),
        trainer=MemoryTrainer(artifacts, max_staleness=CONFIG.max_staleness),
        artifacts=artifacts,
        prompts=DigitSuccessor(),
        buffer=buffer,
    )


def _crashed_run(*, buffered: bool, crash_at: int) -> tuple[MemoryArtifacts, MemoryCheckpointStore, _ListBuffer | None]:
    artifacts, store = MemoryArtifacts(), MemoryCheckpointStore()
    rollout_buffer = _ListBuffer() if buffered else None
    with pytest.raises(_Crash):
        asyncio.run(run_grpo(CONFIG, _tiers(artifacts, buffer=rollout_buffer, scorer=_CrashingScorer(crash_at)), store))
    return artifacts, store, rollout_buffer


@pytest.mark.heavy
@settings(max_examples=6, deadline=None)
@given(data=st.data())
def test_a_resume_that_switches_the_buffer_on_or_off_is_refused_naming_the_field(data):
    """A buffer switched off half way misses the later iterations, one switched on misses the earlier ones: both are
    refused before any work, and resuming as the run started fills the buffer with every iteration once."""
    buffered = data.draw(st.booleans(), label="first attempt keeps a buffer")
    crash_at = data.draw(st.integers(1, CONFIG.iterations - 1), label="crash at iteration")
    artifacts, store, rollout_buffer = _crashed_run(buffered=buffered, crash_at=crash_at)
    saved = store.data
    switched = None if buffered else _ListBuffer()
    with pytest.raises(CheckpointConfigMismatchError, match="field 'buffer' differs") as refused:
        asyncio.run(run_grpo(CONFIG, _tiers(artifacts, buffer=switched), store))
    done = "iteration 0" if crash_at == 1 else f"iterations 0..{crash_at - 1}"
    assert "--no-buffer" in str(refused.value) and done in str(refused.value)
    assert store.data == saved and (switched is None or switched.iterations == [])  # nothing ran
    outcome = asyncio.run(run_grpo(CONFIG, _tiers(artifacts, buffer=rollout_buffer), store))
    assert outcome.resumed_from == crash_at - 1
    if rollout_buffer is not None:
        assert sorted(rollout_buffer.iterations) == list(range(CONFIG.iterations))


def test_a_configuration_mismatch_names_the_fields_that_differ():
    """Two digests say only that something differs; the message says what (`group_size: checkpoint 2, this run 4`)."""
    artifacts, store, _ = _crashed_run(buffered=False, crash_at=2)
    other = replace(CONFIG, group_size=4, seed=6)
    with pytest.raises(CheckpointConfigMismatchError) as refused:
        asyncio.run(run_grpo(other, _tiers(artifacts, buffer=None), store))
    assert "group_size: checkpoint 2, this run 4" in str(refused.value)
    assert "seed: checkpoint 5, this run 6" in str(refused.value)
    assert "iterations" not in str(refused.value).split("(")[1]  # only the differing fields are listed


@pytest.mark.heavy
def test_the_demo_refuses_to_resume_with_no_buffer_and_says_to_use_the_original_flags(tmp_path, capsys):
    """`rl demo grpo --no-buffer` on a run that kept a buffer exits non-zero before training, naming the flag."""
    out = tmp_path / "run"
    args = ["demo", "grpo", "--iterations", "1", "--prompts", "2", "--samples", "2", "--out", str(out)]
    assert main(args) == 0
    checkpoint = (out / "checkpoint.json").read_bytes()
    capsys.readouterr()
    assert main([*args, "--no-buffer"]) != 0
    err = " ".join(capsys.readouterr().err.split())
    assert "field 'buffer' differs" in err and "without --no-buffer" in err and "--fresh" in err
    assert (out / "checkpoint.json").read_bytes() == checkpoint


def _rollout(iteration: int, group: int, sample: int) -> Rollout:
    return Rollout(
        group_id=group,
        question="1 + 1 =",
        answer="2",
        completion="####2",
        prompt_token_ids=[3, 4],
        token_ids=[1, 2],
        logprobs=[-0.5, -0.5],
        policy_version=iteration,
        seed=sample,
    )


def _run_dir_with_buffer(tmp_path, held: list[int], checkpoint_iteration: int | None):
    buffer = VolumeBuffer(LocalVolumeStore(tmp_path / "volumes"), BUFFER_NAME)
    for it in held:
        rollouts = [_rollout(it, 0, s) for s in range(2)]
        buffer.append(it, rollout_rows(it, rollouts, [1.0, 0.0]))
    if checkpoint_iteration is not None:
        ref = ArtifactRef(uri="mem://a", digest="d")
        state = replace(DriverState.initial("c" * 32, ref, ref), iteration=checkpoint_iteration, buffer_version="x")
        (tmp_path / "checkpoint.json").write_bytes(encode_state(state))
    return buffer


def _rescore(run_dir, *extra: str, memory_cap: int | None = None) -> subprocess.CompletedProcess[str]:
    # A subprocess: the exit status and stderr a user sees, however the CLI prints a typed error.
    code = f"import sys; from rl.cli import main; sys.exit(main({['rescore', str(run_dir), *extra]!r}))"
    if memory_cap is not None:  # address space, so a runaway list ends in MemoryError instead of taking the machine
        code = f"import resource; resource.setrlimit(resource.RLIMIT_AS, ({memory_cap}, {memory_cap})); {code}"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)


def test_rescore_refuses_a_buffer_with_holes_and_lists_them(tmp_path):
    """Iterations 1 and 4..5 are missing (5 and 4 past the buffer's own end, known from the checkpoint): refused."""
    buffer = _run_dir_with_buffer(tmp_path, held=[0, 2, 3], checkpoint_iteration=5)
    versions = len(buffer.versions())
    done = _rescore(tmp_path, "--reward", "format")
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert "IncompleteBufferError" in last or "rl rescore" in last
    assert "misses iteration(s) 1, 4..5 of the run's 0..5" in last and "--allow-gaps" in last
    assert len(buffer.versions()) == versions  # nothing re-scored


def test_rescore_of_a_checkpoint_at_the_schemas_limit_is_refused_in_one_line_with_bounded_memory(tmp_path):
    """A checkpoint at iteration 10**12 over a buffer of two: refused (exit 2) even with --allow-gaps, in 2 GiB of
    address space, where listing every missing iteration was a MemoryError (exit 70)."""
    _run_dir_with_buffer(tmp_path, held=[0, 1], checkpoint_iteration=10**12)
    done = _rescore(tmp_path, "--reward", "format", "--allow-gaps", "--json", memory_cap=2 << 30)
    assert done.returncode == 2, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert "misses iteration(s) 2..1000000000000" in last and "more than 100000 missing" in last, last


def test_rescore_warns_of_an_unreadable_checkpoint_in_one_printable_line(tmp_path):
    """A checkpoint whose bytes are not one (here escape sequences): rescore falls back to the buffer's own end and
    says so in a warning that shows the bytes' control characters as escapes."""
    _run_dir_with_buffer(tmp_path, held=[0, 1], checkpoint_iteration=None)
    (tmp_path / "checkpoint.json").write_bytes(b"\x1b]0;pwned\x07")
    done = _rescore(tmp_path, "--reward", "format")
    assert done.returncode == 0, done.stderr
    [warning] = [line for line in done.stderr.splitlines() if "WARNING" in line]
    assert "is unreadable" in warning and warning.isprintable(), warning


def test_rescore_with_allow_gaps_warns_and_reports_the_missing_iterations(tmp_path):
    _run_dir_with_buffer(tmp_path, held=[1, 2], checkpoint_iteration=None)
    done = _rescore(tmp_path, "--reward", "format", "--allow-gaps", "--json")
    assert done.returncode == 0, done.stderr
    assert "WARNING" in done.stderr and "misses iteration(s) 0 of the run's 0..2" in done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1])["missing_iterations"] == [0]


def test_rescore_of_a_complete_buffer_reports_no_missing_iterations(tmp_path):
    _run_dir_with_buffer(tmp_path, held=[0, 1, 2], checkpoint_iteration=1)  # the buffer may run one ahead
    done = _rescore(tmp_path, "--reward", "format", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1])["missing_iterations"] == []


@given(data=st.data())
def test_missing_iterations_and_their_ranges_cover_exactly_the_holes(data):
    """`iteration_ranges(missing_ranges(held, n))` expands back to the iterations of 0..n not held."""
    from rl.commands.rescore import iteration_ranges, missing_ranges

    through = data.draw(st.integers(0, 40), label="through")
    held = data.draw(st.lists(st.integers(0, through + 3), unique=True), label="held")
    missing = [it for a, b in missing_ranges(held, through) for it in range(a, b + 1)]
    assert set(missing) | set(held) >= set(range(through + 1)) and not set(missing) & set(held)
    assert missing == sorted(set(range(through + 1)) - set(held))
    expanded = []
    for part in filter(None, iteration_ranges(missing_ranges(held, through)).split(", ")):
        a, _, b = part.partition("..")
        expanded += range(int(a), int(b or a) + 1)
    assert expanded == missing


def test_a_claimed_iteration_sizes_nothing():
    """docs/guarantees.md: "An iteration number a run directory claims sizes no list and no loop": the gaps below a
    checkpoint at the schema's limit, 10**12, are a few ranges, computed from the iterations that exist."""
    from rl.commands.rescore import iteration_ranges, missing_ranges

    spans = missing_ranges([0, 1, 99_999_999_999], 10**12)
    assert spans == [(2, 99_999_999_998), (100_000_000_000, 10**12)]
    assert iteration_ranges(spans) == "2..99999999998, 100000000000..1000000000000"
