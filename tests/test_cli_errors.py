"""Issue 16 item 8: every expected failure of the `rl` command is a typed error under `rl.errors.RlError`, printed as
one line that says what was wrong and what to do, ending with its family's own exit status; `-v` or RL_TRACEBACK=1
adds the traceback, and only a bug prints one unasked."""

from __future__ import annotations

import errno
import importlib
import pathlib
import re
import shutil
from pathlib import Path

import pytest

import rl.errors
from rl.cli import main

EXIT_TABLE = Path(__file__).resolve().parents[1] / "docs" / "commands.md"
TINY_RUN = ["--iterations", "2", "--prompts", "2", "--samples", "2"]


def _errors(err: str, prog: str) -> list[str]:
    """The lines of stderr the command wrote about its failure (rich's progress bar shares stderr)."""
    return [line for line in err.splitlines() if line.startswith(f"{prog}:")]


def _assert_one_line(err: str, prog: str, *needles: str) -> str:
    assert "Traceback" not in err, err
    [line] = _errors(err, prog)
    for needle in needles:
        assert needle in line, line
    return line


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> Path:
    """A finished 2-iteration demo run; tests damage copies of it (its volumes hold no absolute paths)."""
    out = tmp_path_factory.mktemp("run") / "run"
    assert main(["demo", "grpo", *TINY_RUN, "--out", str(out)]) == 0
    return out


# ------------------------------------------------------------------------------------------------------ hierarchy

FAMILY_MEMBERS = [
    # (module, class, the builtin base an existing `except` clause may name)
    ("rl.errors", "GrpoInputError", ValueError),
    ("rl.errors", "NonFiniteRewardError", ValueError),
    ("rl.errors", "StaleBatchError", ValueError),
    ("rl.errors", "EngineContractError", RuntimeError),
    ("rl.errors", "CheckpointError", RuntimeError),
    ("rl.errors", "MissingAdapterError", RuntimeError),
    ("rl.errors", "ConfigError", ValueError),
    ("rl.errors", "UnknownRewardError", KeyError),
    ("rl.errors", "AgenticInputError", ValueError),
    ("rl.errors", "ArtifactNotFoundError", FileNotFoundError),
    ("rl.errors", "ArtifactCorruptError", Exception),
    ("rl.errors", "InvalidArtifactError", ValueError),
    ("rl.errors", "InvalidPathError", ValueError),
    ("rl.errors", "VersionNotFoundError", LookupError),
    ("rl.errors", "VolumeCorruptedError", Exception),
    ("rl.errors", "RowSchemaError", ValueError),
    ("rl.errors", "BatchError", ValueError),
    ("rl.errors", "StaleBatchError", ValueError),  # the trainer's stale rollout too (was StaleRolloutError)
    ("rl.errors", "AdapterArtifactError", ValueError),
    ("rl.errors", "OptimizerStateError", ValueError),
    ("rl.errors", "TrainerLedgerError", ValueError),
    ("rl.errors", "StepPayloadConflictError", ValueError),
    ("rl.errors", "TrainerMismatchError", ValueError),
]


@pytest.mark.parametrize(("module", "name", "builtin"), FAMILY_MEMBERS)
def test_every_error_family_is_an_rl_error_and_keeps_its_builtin_base(module, name, builtin):
    """`except rl.errors.RlError` catches it, and so does the `except` clause written before the root existed."""
    cls = getattr(importlib.import_module(module), name)
    assert issubclass(cls, rl.errors.RlError) and issubclass(cls, builtin)
    assert cls.exit_code in set(rl.errors.families().values())


def test_each_family_exits_with_its_own_code_and_the_docs_list_every_one():
    """Distinct, non-zero, not 1 (a failed check) nor 70 (a bug); docs/commands.md's exit-status table says the same."""
    codes = rl.errors.families()
    assert len(set(codes.values())) == len(codes)
    assert not {0, 1, 10, 70} & set(codes.values())
    rows = dict(re.findall(r"^\| (\d+) \| `(\w+)`", EXIT_TABLE.read_text(), flags=re.M))
    assert {name: int(code) for code, name in rows.items() if name in codes} == codes


# ---------------------------------------------------------------------------------------- one line per failure


@pytest.mark.heavy
def test_a_corrupt_adapter_ends_in_one_line_and_the_artifact_exit_code(tmp_path, capsys):
    """Resuming a run whose adapter file was damaged names the artifact and how to repair it; no traceback."""
    out = tmp_path / "run"
    assert main(["demo", "grpo", *TINY_RUN, "--out", str(out)]) == 0
    checkpoint = (out / "checkpoint.json").read_text()
    [adapter] = re.findall(r'"adapter": \{"uri": "file://([^"]+)"', checkpoint)
    (Path(adapter) / "adapter_model.safetensors").write_bytes(b"not a safetensors file")
    capsys.readouterr()
    assert main(["demo", "grpo", *TINY_RUN, "--out", str(out)]) == rl.errors.families()["ArtifactError"]
    _assert_one_line(capsys.readouterr().err, "rl demo grpo", adapter, "repair")


@pytest.mark.heavy
def test_a_damaged_volume_manifest_ends_in_one_line_and_the_volume_exit_code(tiny_run, tmp_path, capsys):
    """`rl rescore` of a run whose buffer manifest is not JSON says which file and what to do."""
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    manifest = next((run / "volumes" / "versions").glob("*/manifest.json"))
    manifest.write_text('{"format": ')
    assert main(["rescore", str(run), "--reward", "format"]) == rl.errors.families()["VolumeError"]
    _assert_one_line(capsys.readouterr().err, "rl rescore", str(manifest), "restore it")


def test_a_held_buffer_lock_ends_in_one_line_and_the_volume_exit_code(tiny_run, tmp_path, capsys):
    """A second writer of the run's rollout buffer is refused with a message naming the holder."""
    from rl.storage.volumes.rollout_buffer import BUFFER_NAME
    from rl.storage.volumes.store import LocalVolumeStore

    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    writer = LocalVolumeStore(run / "volumes").new(BUFFER_NAME)
    try:
        assert main(["rescore", str(run), "--reward", "format"]) == rl.errors.families()["VolumeError"]
    finally:
        writer.abandon()
    _assert_one_line(capsys.readouterr().err, "rl rescore", BUFFER_NAME)


def test_a_full_disk_ends_in_one_line_that_says_to_free_space(tmp_path, capsys, monkeypatch):
    """ENOSPC in the middle of a run is the filesystem's exit status (10) and a line about the disk."""
    import rl.deploy.demo

    async def disk_full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "run" / "checkpoint.json"))

    monkeypatch.setattr(rl.deploy.demo, "run_demo", disk_full)
    assert main(["demo", "grpo", *TINY_RUN, "--out", str(tmp_path / "run")]) == 10
    _assert_one_line(capsys.readouterr().err, "rl demo grpo", "No space left on device", "free some space")


def test_out_on_a_read_only_filesystem_ends_in_one_line_before_the_run(tmp_path, capsys, monkeypatch):
    """A read-only --out (simulated: every mkdir under it is refused with EROFS) says to choose a writable one."""
    read_only = tmp_path / "ro"
    real_mkdir = pathlib.Path.mkdir

    def mkdir(self, *args, **kwargs):
        if self.is_relative_to(read_only):
            raise OSError(errno.EROFS, "Read-only file system", str(self))
        return real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(pathlib.Path, "mkdir", mkdir)
    assert main(["demo", "grpo", *TINY_RUN, "--out", str(read_only / "run")]) == 10
    _assert_one_line(capsys.readouterr().err, "rl demo grpo", "Read-only file system", "writable filesystem")


def test_out_that_is_a_file_is_refused_in_one_line_and_left_alone(tmp_path, capsys):
    target = tmp_path / "notes.txt"
    target.write_text("mine")
    assert main(["demo", "grpo", *TINY_RUN, "--fresh", "--out", str(target)]) == 2
    _assert_one_line(capsys.readouterr().err, "rl demo grpo", "is a file", "pass --out")
    assert target.read_text() == "mine"


def test_bench_sections_with_no_section_is_refused_in_one_line(capsys):
    assert main(["bench", "--sections", ","]) == 2
    _assert_one_line(capsys.readouterr().err, "rl bench", "names no section", "choose from sim, cpu, volumes")


# ------------------------------------------------------------------------------------------------- tracebacks


@pytest.mark.parametrize(
    ("argv", "env"),
    [
        (["-v", "bench", "--sections", ","], ""),
        (["bench", "--sections", ",", "--verbose"], ""),
        (["bench", "--sections", ","], "1"),
    ],
    ids=["-v before", "--verbose after", "RL_TRACEBACK=1"],
)
def test_verbose_or_the_environment_variable_adds_the_traceback(argv, env, capsys, monkeypatch):
    monkeypatch.setenv("RL_TRACEBACK", env)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and "InputError" in err
    assert err.rstrip().splitlines()[-1].startswith("rl bench: --sections")


def test_a_bug_prints_its_traceback_and_exits_70(capsys, monkeypatch):
    """An exception outside the hierarchy is not an expected failure: the traceback shows, with a request to report."""
    import rl.bench.sim

    def broken(**_):
        raise ZeroDivisionError("division by zero")

    monkeypatch.setattr(rl.bench.sim, "simulator_bench", broken)
    assert main(["bench", "--sections", "sim"]) == 70
    err = capsys.readouterr().err
    assert "Traceback" in err and "ZeroDivisionError" in err and "please report it" in err
