"""A hostile-directory fuzzer: a real run directory, mutated (files, links, types, sizes, encodings), then resumed and
re-scored: every outcome is success or one line with a documented exit status, nothing outside the directory is
written, and nothing the run published inside it is lost.

The mutations draw every class of docs/guarantees.md's run-directory promises: file types (FIFO, socket, device where
this process may make one, a directory for a file and the reverse), hard links to a file outside, sparse files of a
gigabyte, control characters in link targets and in values, and loader configs (a base model naming code to run, an
unknown model_type, sizes past bounds, a forged adapter with a regex target, a pickle or a 2**40-byte header). Each
command runs under a deadline (a hang fails the example), and the process's peak memory must stay within a bound.

The base directory is a real `rl demo grpo` run stopped after its first checkpoint (of two iterations), made once per
session, so a resume trains, appends to the buffer, stores artifacts and writes the checkpoint and report. `unit` tries
a few directories (RL_FUZZ_EXAMPLES, default 3); `nox -s chaos` tries hundreds and prints what each outcome was
(`--hypothesis-show-statistics`).
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import socket
import stat
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from rl.cli import main
from rl.identity import content_digest
from rl.storage.artifacts import compute_digest

EXAMPLES = int(os.environ.get("RL_FUZZ_EXAMPLES", "3"))
# The documented exit statuses (docs/commands.md's table): success, a family's, argparse's usage error. 70 is a bug.
DOCUMENTED = {0, 2, 3, 4, 5, 6, 7, 8, 9, 10}
DEMO = ("--iterations", "2", "--prompts", "2", "--samples", "2", "--seed", "0")
DEADLINE_S = 120  # a command normally takes about a second: past this it hung (a FIFO, a regex, a loop)
MEMORY_BOUND = 768 << 20  # peak resident memory may grow this much over the base run's (a sparse file is 1 GiB)
SPARSE = 1 << 30
ROOT = os.geteuid() == 0  # mknod needs root: without it the device mutation is skipped, and says so (event)
# Escape sequences that set a terminal's title, clear it and fake a line; a bidi override.
ESCAPES = "\x1b]0;pwned\x07\x1b[2J\rall checks passed\u202e"


class Hung(BaseException):
    """A command ran past DEADLINE_S (a BaseException, so the CLI's handler does not turn it into an exit status)."""


class _Stop(Exception):
    """Ends the base run right after its first checkpoint."""


@pytest.fixture(scope="session")
def base_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real run directory with a checkpoint at iteration 0 of 2, made once per session."""
    import rl.loop.grpo as grpo

    run = tmp_path_factory.mktemp("hostile-base") / "run"
    real = grpo.save_state

    async def save_then_stop(store, state, *rest):  # type: ignore[no-untyped-def]
        await real(store, state, *rest)
        raise _Stop

    mp = pytest.MonkeyPatch()
    mp.setattr(grpo, "save_state", save_then_stop)
    try:
        main(["demo", "grpo", *DEMO, "--out", str(run)])
    finally:
        mp.undo()
    assert (run / "checkpoint.json").is_file() and (run / "volumes").is_dir()
    global _BASE_RSS
    _BASE_RSS = _peak_rss()
    return run


_BASE_RSS = 0


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
    st.just(ESCAPES),
    st.just(ESCAPES * 2000),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
)


# Loader configs: (target, change). "base" edits base-*/config.json; "adapter" forges the checkpoint's adapter (a new
# object with its own digest, the checkpoint pointed at it and its digest recomputed, as anyone can).
_LOADERS = [
    ("base", {"model_type": "evil", "auto_map": {"AutoModelForCausalLM": "evil.EvilModel"}}),
    ("base", {"auto_map": {"AutoConfig": "evil.EvilConfig"}}),
    ("base", {"vocab_size": 10**12}),
    ("base", {"model_type": "gpt2"}),
    ("base-header", None),
    ("adapter", {"target_modules": "(a+)+$"}),
    ("adapter", {"target_modules": ["(a|aa)+$"]}),
    ("adapter", {"rank_pattern": {"(a+)+$": 4}}),
    ("adapter", {"r": 10**9}),
    ("adapter-bin", None),
    ("adapter-header", None),
]
_KINDS = ["bytes", "symlink", "delete", "dir-for-file", "file-for-dir", "fifo", "socket", "device", "hardlink"]
_KINDS += ["sparse", "escape-symlink", "json-field", "checkpoint-field", "loader"]
# RL_FUZZ_KINDS=loader,sparse draws only those kinds (to search one class further).
_KINDS = [k for k in _KINDS if k in os.environ.get("RL_FUZZ_KINDS", ",".join(_KINDS)).split(",")]


@st.composite
def mutations(draw: st.DrawFn, entries: list[str]) -> tuple[str, str, object]:
    """(kind, relative path, payload): one change to one entry of the run directory."""
    kind = draw(st.sampled_from(_KINDS))
    rel = draw(st.sampled_from(entries))
    if kind == "bytes":
        return kind, rel, draw(_file_bytes())
    if kind == "symlink":
        return kind, rel, draw(st.sampled_from(["outside", "outside/file.txt", "/", "."]))
    if kind == "escape-symlink":
        return kind, draw(st.sampled_from(["checkpoint.json", "metrics.jsonl", rel])), ESCAPES
    if kind == "device":
        return kind, rel, draw(st.sampled_from([(1, 3), (1, 5)]))  # /dev/null, /dev/zero: harmless, endless
    if kind in ("hardlink", "fifo", "socket"):
        # Most often the files the run writes: metrics.jsonl, report.html, the checkpoint, the writer's lock.
        return kind, draw(st.sampled_from(["metrics.jsonl", "report.html", "checkpoint.json", ".rl-run", rel])), None
    if kind == "loader":
        return kind, rel, draw(st.sampled_from(_LOADERS))
    if kind in ("json-field", "checkpoint-field"):
        return kind, rel if kind == "json-field" else "checkpoint.json", (draw(st.text(max_size=12)), draw(_VALUES))
    return kind, rel, None


def _apply(run: Path, outside: Path, kind: str, rel: str, payload: object) -> str:
    """Apply one mutation; returns the entry it changed (for `_kept`)."""
    path = run / rel
    if kind in ("symlink", "escape-symlink"):
        target = {"outside/file.txt": str(outside / "file.txt"), "outside": str(outside)}.get(str(payload), payload)
        _remove(path)
        os.symlink(str(target), path)
    elif kind == "bytes":
        _remove(path)
        path.write_bytes(payload)  # type: ignore[arg-type]
    elif kind == "delete":
        _remove(path)
    elif kind == "dir-for-file":
        _remove(path)
        path.mkdir()
    elif kind == "file-for-dir":
        _remove(path)
        path.write_bytes(b"{}")
    elif kind == "fifo":
        _remove(path)
        os.mkfifo(path)
    elif kind == "socket":
        _remove(path)
        _bind_socket(path)
    elif kind == "device":
        if not ROOT:
            event("device: skipped (not root: mknod needs root)")
            return rel
        _remove(path)
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(*payload))  # type: ignore[misc]
    elif kind == "hardlink":
        _remove(path)
        os.link(outside / "file.txt", path)
    elif kind == "sparse":
        if path.is_dir() and not path.is_symlink():
            os.chmod(path, 0o755)
            path = path / "sparse.bin"
            path.touch()
        elif not path.is_file() or path.is_symlink():
            return rel
        os.chmod(path, 0o644)
        os.truncate(path, SPARSE)
    elif kind == "loader":
        return _loader(run, outside, *payload)  # type: ignore[misc]
    else:
        _edit_json(path, payload, recompute=kind == "checkpoint-field")
    return rel


def _bind_socket(path: Path) -> None:
    """A Unix socket file at `path`, nothing listening (bound from its directory: AF_UNIX paths are short)."""
    cwd = os.getcwd()
    os.chdir(path.parent)
    try:
        s = socket.socket(socket.AF_UNIX)
        s.bind(path.name)
        s.close()
    finally:
        os.chdir(cwd)


def _loader(run: Path, outside: Path, target: str, change: dict[str, object] | None) -> str:
    if target.startswith("base"):
        [base] = [p for p in run.glob("base-*") if p.is_dir()]
        if target == "base-header":
            _header_2_40(base / "model.safetensors")
        else:
            # The code the auto_map names: it would write outside, so a run of it is seen as a change there.
            (base / "evil.py").write_text(f"open({str(outside / 'ran')!r}, 'w').close()\n")
            config = json.loads((base / "config.json").read_text())
            (base / "config.json").write_text(json.dumps({**config, **(change or {})}))
        return base.name
    doc = json.loads((run / "checkpoint.json").read_bytes())
    objects = run / "artifacts" / "objects"
    obj = objects / doc["state"]["adapter"]["digest"].removeprefix("sha256:")
    if not obj.is_dir():
        return "checkpoint.json"
    files = {p.name: p.read_bytes() for p in obj.iterdir()}
    if target == "adapter":
        files["adapter_config.json"] = json.dumps(
            {**json.loads(files["adapter_config.json"]), **(change or {})}
        ).encode()
    elif target == "adapter-bin":
        files["adapter_model.bin"] = b"\x80\x04K\x01."  # a pickle (of 1): never unpickled
    else:
        weights = files["adapter_model.safetensors"]
        files["adapter_model.safetensors"] = (1 << 40).to_bytes(8, "little") + weights[8:]
    digest = compute_digest(files)
    forged = objects / digest.removeprefix("sha256:")
    forged.mkdir()
    for name, content in files.items():
        (forged / name).write_bytes(content)
    doc["state"]["adapter"] = {"uri": forged.as_uri(), "digest": digest}
    doc["digest"] = content_digest(doc["state"])
    os.chmod(run / "checkpoint.json", 0o644)
    (run / "checkpoint.json").write_text(json.dumps(doc))
    return f"artifacts/objects/{forged.name}"


def _header_2_40(path: Path) -> None:
    os.chmod(path, 0o644)
    with open(path, "r+b") as f:
        f.write((1 << 40).to_bytes(8, "little"))


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
    """`rl ARGV`'s exit status and stderr, under a deadline: a command still running after DEADLINE_S raises `Hung`
    (a blocked open is interrupted by the alarm's signal too)."""

    def hung(*_: object) -> None:
        raise Hung(f"rl {' '.join(argv)} ran past {DEADLINE_S} s")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(DEADLINE_S)
    try:
        rc = main(argv)
    except SystemExit as exc:  # argparse
        rc = int(exc.code or 0)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    return rc, capsys.readouterr().err


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


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
    before_outside = snapshot(outside)
    rel = _apply(run, outside, kind, rel, payload)
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
        shown = [line for line in err.splitlines() if line.startswith("rl ")]
        assert all(line.isprintable() for line in shown), f"{argv[0]} after {kind} {rel} printed raw controls: {shown}"
    event(f"{kind}: {' '.join(outcomes)}")
    assert snapshot(outside) == before_outside, f"{kind} {rel} let a command write outside the run directory"
    grown = _peak_rss() - _BASE_RSS
    assert grown < MEMORY_BOUND, f"{kind} {rel}: peak memory grew {grown >> 20} MiB over the base run's"
    after = set(_entries(run))
    lost = [e for e in kept if e not in after]
    assert not lost, f"{kind} {rel}: {lost[:5]} went missing"
