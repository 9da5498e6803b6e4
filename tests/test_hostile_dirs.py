"""A hostile-directory fuzzer: a real run directory, mutated (files, links, types, sizes, encodings), then resumed and
re-scored: every outcome is success or one line with a documented exit status, nothing outside the directory is
written, and nothing the run published inside it is lost.

The base directory is a real `rl demo grpo` run stopped after its first checkpoint (of two iterations), made once per
session, so a resume trains, appends to the buffer, stores artifacts and writes the checkpoint and report. `unit` tries
a few directories (RL_FUZZ_EXAMPLES, default 3); `nox -s chaos` tries hundreds and prints what each outcome was
(`--hypothesis-show-statistics`).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from rl.cli import main
from rl.identity import content_digest

EXAMPLES = int(os.environ.get("RL_FUZZ_EXAMPLES", "3"))
# The documented exit statuses (docs/commands.md's table): success, a family's, argparse's usage error. 70 is a bug.
DOCUMENTED = {0, 2, 3, 4, 5, 6, 7, 8, 9, 10}
DEMO = ("--iterations", "2", "--prompts", "2", "--samples", "2", "--seed", "0")


class _Stop(Exception):
    """Ends the base run right after its first checkpoint."""


@pytest.fixture(scope="session")
def base_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real run directory with a checkpoint at iteration 0 of 2, made once per session."""
    import rl.loop.grpo as grpo

    run = tmp_path_factory.mktemp("hostile-base") / "run"
    real = grpo.save_state

    async def save_then_stop(store, state):  # type: ignore[no-untyped-def]
        await real(store, state)
        raise _Stop

    mp = pytest.MonkeyPatch()
    mp.setattr(grpo, "save_state", save_then_stop)
    try:
        main(["demo", "grpo", *DEMO, "--out", str(run)])
    finally:
        mp.undo()
    assert (run / "checkpoint.json").is_file() and (run / "volumes").is_dir()
    return run


def _entries(run: Path) -> list[str]:
    """Every path under the run directory, relative, sorted (links not followed)."""
    out = []
    for dirpath, dirnames, filenames in os.walk(run):
        for name in dirnames + filenames:
            out.append(str((Path(dirpath) / name).relative_to(run)))
    return sorted(out)


def snapshot(root: Path) -> dict[str, object]:
    out: dict[str, object] = {}
    for rel in _entries(root):
        path = root / rel
        out[rel] = ("link", os.readlink(path)) if path.is_symlink() else "dir" if path.is_dir() else path.read_bytes()
    return out


def _file_bytes() -> st.SearchStrategy[bytes]:
    """What a crafted file may hold: damaged, foreign, huge, deep, non-UTF-8 or non-finite."""
    return st.one_of(
        st.binary(max_size=64),
        st.just(b""),
        st.just(b"\xff\xfe\x00garbage"),
        st.just(b"[" * 50_000 + b"]" * 50_000),
        st.just(b'{"a": ' + b"9" * 5000 + b"}"),
        st.just(b'{"reward": NaN}\n'),
        st.just(b"x" * (1 << 20)),
        st.sampled_from([b"null", b"[]", b'"s"', b"1", b"{}"]),
    )


# Values a forger puts into a JSON field (the digest of a checkpoint then recomputed, as anyone can).
_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(),
    st.text(max_size=20),
    st.just("<script>x</script>"),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
)


@st.composite
def mutations(draw: st.DrawFn, entries: list[str]) -> tuple[str, str, object]:
    """(kind, relative path, payload): one change to one entry of the run directory."""
    kind = draw(
        st.sampled_from(["bytes", "symlink", "delete", "dir-for-file", "fifo", "json-field", "checkpoint-field"])
    )
    rel = draw(st.sampled_from(entries))
    if kind == "bytes":
        return kind, rel, draw(_file_bytes())
    if kind == "symlink":
        return kind, rel, draw(st.sampled_from(["outside", "outside/file.txt", "/", "."]))
    if kind in ("json-field", "checkpoint-field"):
        return kind, rel if kind == "json-field" else "checkpoint.json", (draw(st.text(max_size=12)), draw(_VALUES))
    return kind, rel, None


def _apply(run: Path, outside: Path, kind: str, rel: str, payload: object) -> None:
    path = run / rel
    if kind == "symlink":
        target = (
            str(outside / "file.txt")
            if payload == "outside/file.txt"
            else str(outside)
            if payload == "outside"
            else str(payload)
        )
        _remove(path)
        os.symlink(target, path)
    elif kind == "bytes":
        _remove(path)
        path.write_bytes(payload)  # type: ignore[arg-type]
    elif kind == "delete":
        _remove(path)
    elif kind == "dir-for-file":
        _remove(path)
        path.mkdir()
    elif kind == "fifo":
        _remove(path)
        os.mkfifo(path)
    else:
        _edit_json(path, payload, recompute=kind == "checkpoint-field")


def _edit_json(path: Path, payload: object, *, recompute: bool) -> None:
    key, value = payload  # type: ignore[misc]
    try:
        doc = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return
    target = doc["state"] if recompute and isinstance(doc, dict) and isinstance(doc.get("state"), dict) else doc
    if not isinstance(target, dict) or not target:
        return
    # An existing key most of the time (a type change), else a new one.
    name = sorted(target)[len(key) % len(target)] if key[:1] != "!" else key
    target[name] = value
    if recompute:
        doc["digest"] = content_digest(doc["state"])
    os.chmod(path, 0o644)
    path.write_text(json.dumps(doc))


def _remove(path: Path) -> None:
    if path.is_symlink() or not path.exists():
        if os.path.lexists(path):
            path.unlink()
        return
    if path.is_dir():
        for dirpath, _dirs, _ in os.walk(path):
            os.chmod(dirpath, 0o755)
        shutil.rmtree(path)
    else:
        os.chmod(path.parent, 0o755)
        path.unlink()


# What a run or rescore legitimately rewrites, replaces or cleans up: everything else it published must survive.
_TRANSIENT = ("checkpoint.json", "metrics.jsonl", "report.html", ".rl-writer", "volumes/staging", "volumes/locks")
_TRANSIENT += ("artifacts/tmp", "artifacts/refs", ".checkpoint.json.")


def _kept(before: list[str], mutated: str) -> list[str]:
    return [
        rel
        for rel in before
        if not rel.startswith(_TRANSIENT)
        and rel != mutated
        and not rel.startswith(mutated + "/")
        and not mutated.startswith(rel + "/")
    ]


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    try:
        rc = main(argv)
    except SystemExit as exc:  # argparse
        rc = int(exc.code or 0)
    return rc, capsys.readouterr().err


@pytest.mark.fuzz
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(data=st.data())
def test_a_mutated_run_directory_resumes_or_fails_in_one_line_and_never_writes_outside(
    base_run: Path, tmp_path_factory: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str], data: st.DataObject
) -> None:
    """Any one mutation of a real run directory: resume and rescore each succeed or end in one line with a documented
    status; the outside tree is unchanged; nothing the run published (versions, artifacts, base model) is lost."""
    root = tmp_path_factory.mktemp("hostile")
    outside = root / "outside"
    (outside / "sub").mkdir(parents=True)
    (outside / "file.txt").write_text("precious\n")
    run = root / "run"
    shutil.copytree(base_run, run, symlinks=True)
    entries = [e for e in _entries(run) if not e.startswith(".rl-writer")]
    kind, rel, payload = data.draw(mutations(entries), label="mutation")
    _apply(run, outside, kind, rel, payload)
    before_outside = snapshot(outside)
    kept = _kept(_entries(run), rel)
    outcomes: list[str] = []
    for argv in (["demo", "grpo", *DEMO, "--out", str(run)], ["rescore", str(run), "--reward", "format", "--json"]):
        rc, err = _run(argv, capsys)
        outcomes.append(f"{argv[0]}={rc}")
        assert rc in DOCUMENTED, f"{argv[0]} exited {rc} after {kind} {rel}:\n{err}"
        assert "Traceback" not in err, f"{argv[0]} after {kind} {rel} printed a traceback:\n{err}"
        if rc != 0:
            # The one line `rl COMMAND: what was wrong; what to do` (the progress bar and warnings aside).
            lines = [line for line in err.splitlines() if line.startswith("rl ") and "WARNING" not in line]
            assert len(lines) == 1, f"{argv[0]} after {kind} {rel} printed {len(lines)} error lines:\n{err}"
    event(f"{kind}: {' '.join(outcomes)}")
    assert snapshot(outside) == before_outside, f"{kind} {rel} let a command write outside the run directory"
    after = set(_entries(run))
    lost = [e for e in kept if e not in after]
    assert not lost, f"{kind} {rel}: {lost[:5]} went missing"
