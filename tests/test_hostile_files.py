"""Every file read from a run directory is parsed into typed, bounded values before use: a crafted checkpoint or buffer
row ends in one line naming the file and field with its family's exit status, never a traceback (exit 70), never a
silent NaN; and the report escapes whatever it prints.
"""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from report_rows import rows

from rl.cli import main
from rl.deploy.report import render_report
from rl.errors import CheckpointCorruptError, CheckpointError
from rl.identity import content_digest
from rl.storage.checkpoint.file_store import FileCheckpointStore
from rl.storage.checkpoint.format import DriverState, decode_state, encode_state
from rl.storage.checkpoint.resume import load_state
from rl.storage.volumes.buffer import VolumeBuffer, rollout_rows
from rl.storage.volumes.rollout_buffer import BUFFER_NAME
from rl.storage.volumes.store import LocalVolumeStore
from rl.types import ArtifactRef, EvalResult, Rollout

MARKUP = '<img src=x onerror="document.body.dataset.pwned=1"><script>document.body.dataset.pwned=1</script>'


def _state() -> DriverState:
    ref = ArtifactRef(uri="file:///run/artifacts/objects/a", digest="sha256:" + "a" * 64)
    return replace(
        DriverState.initial("c" * 32, ref, ref),
        iteration=1,
        policy_version=2,
        history=rows(2),
        evals=[EvalResult(1, 4, 0.5, 0.75, 8)],
    )


def _forged(edit: Any) -> bytes:
    """A real checkpoint with `edit(state_dict)` applied and its digest recomputed, as anyone can."""
    doc = json.loads(encode_state(_state()))
    edit(doc["state"])
    doc["digest"] = content_digest(doc["state"])
    return json.dumps(doc).encode()


def _set(path: str, value: Any) -> Any:
    def edit(state: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node: Any = state
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        node[int(last) if isinstance(node, list) else last] = value

    return edit


FORGED_FIELDS = {
    "a string iteration": ("iteration", "1", "state.iteration"),
    "a negative iteration": ("iteration", -7, "state.iteration"),
    "a NaN iteration": ("iteration", float("nan"), "state.iteration"),
    "markup as the last row's adapter_version": (
        "history.1.adapter_version",
        MARKUP,
        r"state.history\[1\].adapter_version",
    ),
    "markup as an evaluation's k": ("evals.0.k", MARKUP, r"state.evals\[0\].k"),
    "a boolean count": ("history.0.num_rollouts", True, r"state.history\[0\].num_rollouts"),
    "a 2 MiB sample": ("history.0.sample_completion", "x" * (2 << 20), r"state.history\[0\].sample_completion"),
    "a list for a ref": ("adapter", ["uri", "digest"], "state.adapter"),
    "a missing field": ("history.0", {"iteration": 0}, r"state.history\[0\]"),
    "an unknown field": ("surprise", 1, "state.surprise"),
    "a NaN held-out rate": ("evals.0.avg_at_k", float("nan"), r"state.evals\[0\].avg_at_k"),
}


@pytest.mark.parametrize("case", sorted(FORGED_FIELDS))
def test_a_forged_checkpoint_field_is_refused_naming_it(case):
    """Digest recomputed, one field of the wrong type or out of bounds: CheckpointError (exit 3) naming the field."""
    path, value, shown = FORGED_FIELDS[case]
    blob = _forged(_set(path, value))
    with pytest.raises(CheckpointCorruptError, match=shown) as info:
        decode_state(blob, "run/checkpoint.json")
    assert info.value.exit_code == 3 and "run/checkpoint.json" in str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    "blob",
    [
        b'{"schema": 1, "digest": "d", "state": ' + b"[" * 200_000 + b"]" * 200_000 + b"}",
        b'{"schema": 1, "digest": "d", "state": {"iteration": ' + b"9" * 5000 + b"}}",
        b'{"schema": 1, "digest": "\xff\xfe", "state": {}}',
        b"[1, 2, 3]",
        b'{"schema": true, "digest": "d", "state": {}}',
    ],
    ids=["200000-deep", "5000-digit int", "not UTF-8", "not an object", "boolean schema"],
)
def test_a_checkpoint_that_is_not_ours_is_a_checkpoint_error_not_a_bug(blob):
    """Deep nesting, a huge integer, bad UTF-8, the wrong JSON type: each a CheckpointError, not a traceback."""
    with pytest.raises(CheckpointError):
        decode_state(blob)


def test_load_state_names_the_checkpoint_file(tmp_path):
    """The message names the file, so a user knows which one to delete or restore."""
    path = tmp_path / "checkpoint.json"
    path.write_bytes(_forged(_set("iteration", "1")))
    with pytest.raises(CheckpointCorruptError, match=re.escape(str(path))):
        asyncio.run(load_state(FileCheckpointStore(path), None, None))  # type: ignore[arg-type]


def test_a_checkpoint_larger_than_any_we_write_is_refused_before_it_is_parsed(tmp_path, monkeypatch):
    """The size bound is checked on the bytes, before json parses them (a huge field is slow and dear to parse)."""
    import rl.storage.checkpoint.file_store as file_store

    monkeypatch.setattr(file_store, "MAX_CHECKPOINT_BYTES", 1000)
    path = tmp_path / "checkpoint.json"
    path.write_bytes(b" " * 1001)
    with pytest.raises(CheckpointCorruptError, match="larger than 1000 bytes"):
        asyncio.run(FileCheckpointStore(path).load())


def test_the_report_escapes_every_value_whatever_its_type():
    """Markup where a number goes (the last row's adapter_version, an evaluation's k: the finding's two) is text."""
    history = rows(2)
    history[-1] = replace(history[-1], policy_version=MARKUP)  # type: ignore[arg-type]
    page = render_report(history, status="running", evals=[EvalResult(1, MARKUP, 0.5, 0.5, 8)])  # type: ignore[arg-type]
    assert "<script" not in page and "<img" not in page
    assert "&lt;script&gt;" in page


@pytest.mark.heavy
def test_a_task_metric_named_with_mathtext_is_drawn_literally():
    """`$\\foo{$` as a task-metric name (from a crafted row) is a title, not a matplotlib mathtext parse error."""
    history = [replace(r, task_metrics={"$\\foo{$": 0.5, "a$b": 0.1}) for r in rows(3)]
    page = render_report(history, status="running")
    assert "\\foo{" in page


def _rollout(group: int) -> Rollout:
    return Rollout(group, "3+1=", "4", "4", [1, 2], [3], [-0.5], 0, group)


def _run_with_buffer(tmp_path: Path) -> tuple[Path, LocalVolumeStore]:
    run = tmp_path / "run"
    store = LocalVolumeStore(run / "volumes", durable=False)
    buffer = VolumeBuffer(store, BUFFER_NAME)
    buffer.append(0, rollout_rows(0, [_rollout(0), _rollout(1)], [1.0, 0.0]))
    return run, store


def _forge_rows(store: LocalVolumeStore, payload: bytes) -> None:
    """A new head whose iteration-0 file holds `payload`, behind a valid manifest (published through the store)."""
    with store.versions()[-1].fork(BUFFER_NAME) as rw:
        rw.write_bytes("iter-00000.jsonl", payload)
        rw.finalize("forged")


def _row(**overrides: Any) -> dict[str, Any]:
    return {**rollout_rows(0, [_rollout(0)], [1.0])[0], **overrides}


FORGED_ROWS = {
    "not UTF-8": b'{"question": "\xff"}\n',
    "a huge integer": json.dumps(_row()).replace('"seed": 0', '"seed": ' + "9" * 5000).encode() + b"\n",
    "deep nesting": b"[" * 100_000 + b"]" * 100_000 + b"\n",
    "a wrong type": json.dumps(_row(group_id="0")).encode() + b"\n",
    "a missing field": json.dumps({k: v for k, v in _row().items() if k != "completion"}).encode() + b"\n",
    "a non-object row": b"[1, 2]\n",
    "a NaN reward": json.dumps(_row()).replace('"reward": 1.0', '"reward": NaN').encode() + b"\n",
    "a boolean reward": json.dumps(_row(reward=True)).encode() + b"\n",
}


@pytest.mark.parametrize("case", sorted(FORGED_ROWS))
def test_rescore_of_forged_rows_exits_5_in_one_line_and_publishes_nothing(tmp_path, capsys, case):
    """Rows behind a valid manifest that are not rows this tool writes: `rl rescore --json` exits 5 (VolumeError)
    with one line naming the file and line, prints no JSON, and publishes no new version (a NaN reward once printed
    "mean reward nan" and exited 0, and with --json published, then crashed)."""
    run, store = _run_with_buffer(tmp_path)
    _forge_rows(store, FORGED_ROWS[case])
    versions = sorted(p.name for p in (store.root / "versions").iterdir())
    assert main(["rescore", str(run), "--reward", "format", "--json"]) == 5
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "iter-00000.jsonl" in lines[0] and "line 1" in lines[0], lines
    assert sorted(p.name for p in (store.root / "versions").iterdir()) == versions


def test_an_empty_out_is_refused_not_taken_as_the_current_folder(capsys):
    """`--out ""` (an unset variable) is a usage error, not a run in the current directory."""
    with pytest.raises(SystemExit) as info:
        main(["demo", "grpo", "--iterations", "1", "--out", ""])
    assert info.value.code == 2
    assert "empty path" in capsys.readouterr().err


def test_a_full_disk_in_the_base_model_build_is_the_filesystems_exit_status(tmp_path, capsys, monkeypatch):
    """safetensors reports ENOSPC as its own error type: the demo maps it to OSError (exit 10, "free some space"),
    not a bug (70), and the directory stays resumable (only the staging directory is left, discarded next start)."""
    import safetensors

    import rl.deploy.local

    def full(out_dir: Path, config: Any) -> None:
        (out_dir / "config.json").write_text("{}")
        raise safetensors.SafetensorError(
            'Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No space left on device" })'
        )

    monkeypatch.setattr(rl.deploy.local, "build_tiny_model", full)
    run = tmp_path / "run"
    assert main(["demo", "grpo", "--iterations", "1", "--out", str(run)]) == 10
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "No space left on device" in err[0]
    assert not any(p.name.startswith("base-") for p in run.iterdir())
