"""A hostile model-directory fuzzer (issue 50's classes): a real tiny model directory, mutated as an attacker would,
then trained by `rl demo grpo --model DIR`: every outcome is a harmless success or one line with a documented exit
status (2-10), with no traceback, no raw escape sequence, no hang, bounded memory, and nothing outside the model and
run directories read or written.

Each command runs in a child process (an address-space limit, a deadline, an audit hook that records every file it
opens outside); the child imports torch, so a draw costs seconds: marked `fuzz`, out of `unit`. Run it with
`nox -s chaos` or `pytest tests/test_hostile_model_dirs.py -m fuzz -p no:randomly` (RL_MODEL_FUZZ_EXAMPLES draws per
class, default 1; the first draw of each class is the attack issue 50 reports).

`OPEN` lists classes not fixed yet: each is a strict xfail, so a class that starts passing fails until it is taken
off the list. It is empty.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from rl.models.converted_cache import write_manifest
from rl.models.pretrained import SMOLLM2, SOURCE_FILE

EXAMPLES = int(os.environ.get("RL_MODEL_FUZZ_EXAMPLES", "1"))
DOCUMENTED = {0, 2, 3, 4, 5, 6, 7, 8, 9, 10}
DEADLINE_S = 150  # a draw took 5-55 s on 2 busy cores: past this it hung
ADDRESS_SPACE = 12 << 30  # the child's limit: a config describing a terabyte must be refused before it allocates
PEAK_RSS = 3 << 30  # a bound far above a tiny model's run (~1 GiB with torch), below a sparse gigabyte read whole
REPO = Path(__file__).resolve().parents[1]
ESCAPES = "\x1b]0;pwned\x07\x1b[2J\rall checks passed\u202e"
SPARSE = 1 << 30

# Issue 50's classes; each list's first entry is the attack the issue reports.
VARIANTS: dict[str, list[object]] = {
    "template-symlink-outside": ["chat_template.jinja", "tokenizer.json"],
    "template-sparse": [SPARSE],
    "config-sizes-add-up": [
        {"hidden_size": 1 << 15, "intermediate_size": 1 << 18, "num_hidden_layers": 1 << 10, "vocab_size": 1 << 20},
        {"hidden_size": 1 << 14, "num_hidden_layers": 1 << 9},
    ],
    "heads-not-dividing-kv": [{"num_key_value_heads": 3}, {"num_attention_heads": 5, "num_key_value_heads": 2}],
    "odd-head-dim": [{"head_dim": 15}, {"head_dim": 7}, {"head_dim": 33}],
    "short-context": [{"max_position_embeddings": 4}, {"max_position_embeddings": 1}],
    "generation-config": [b'{"max_new_tokens": "x"}', b'{"eos_token_id": {"a": 1}}', b"[]", b"not json"],
    "tokenizer-ids-beyond-vocab": [{"3": 10**6}, {"+": 50}],
    "missing-weight": ["model.norm.weight", "lm_head.weight"],
    "swapped-converted-cache": ["model.safetensors", "config.json", "chat_template.jinja"],
    "escape-tensor-names": [ESCAPES],
}
OPEN: set[str] = set()  # classes not yet fixed, each a strict xfail: none since issue 50's branches merged
# Classes no run may survive: a model that cannot be what its config says must be refused, never randomly filled in.
MUST_REFUSE = {
    "config-sizes-add-up",
    "heads-not-dividing-kv",
    "odd-head-dim",
    "short-context",
    "tokenizer-ids-beyond-vocab",
    "missing-weight",
    "swapped-converted-cache",
}
KINDS = [pytest.param(k, marks=pytest.mark.xfail(strict=True, reason="issue 50")) if k in OPEN else k for k in VARIANTS]

# The child: limits, an audit hook recording opens outside, then the CLI; its last stderr line is a JSON report.
CHILD = """
import json, os, resource, sys
outside, argv, limit = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
seen = []
def hook(event, args):
    if event == "open" and args and isinstance(args[0], (str, bytes)):
        path = os.path.realpath(os.fsdecode(args[0]))
        if path == outside or path.startswith(outside + os.sep):
            seen.append(path)
sys.addaudithook(hook)
from rl.cli import main
try:
    rc = main(argv)
except SystemExit as exc:
    rc = int(exc.code or 0)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
sys.stderr.write("\\n" + json.dumps({"rc": rc, "read_outside": seen[:3], "peak": peak}) + "\\n")
sys.stderr.flush()
os._exit(0)
"""


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from rl.models.tiny import TinyModelConfig, build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("hostile-model") / "model", TinyModelConfig(seed=3))


def _edit_json(path: Path, change: dict[str, object]) -> None:
    path.write_text(json.dumps({**json.loads(path.read_text()), **change}))


def _rewrite_tensors(path: Path, *, drop: str | None = None, add: str | None = None) -> None:
    import torch
    from safetensors.torch import load_file, save_file

    tensors = load_file(path)
    tensors.pop(drop or "", None)
    if add is not None:
        tensors[add] = torch.zeros(2)
    save_file(tensors, path, metadata={"format": "pt"})


def _apply(kind: str, variant: object, model: Path, outside: Path, cache: Path) -> list[str]:
    """Mutate `model` (or build a converted cache under `cache`); the `--model` argument to pass."""
    if kind == "template-symlink-outside":
        secret = outside / "secret.jinja"
        secret.write_text("OUTSIDE-SECRET {% for m in messages %}{{ m['content'] }}{% endfor %}")
        (model / str(variant)).unlink(missing_ok=True)
        (model / str(variant)).symlink_to(secret)
    elif kind == "template-sparse":
        with open(model / "chat_template.jinja", "wb") as f:
            f.truncate(int(variant))  # type: ignore[call-overload]
    elif kind in ("config-sizes-add-up", "heads-not-dividing-kv", "odd-head-dim", "short-context"):
        _edit_json(model / "config.json", variant)  # type: ignore[arg-type]
    elif kind == "generation-config":
        (model / "generation_config.json").write_bytes(variant)  # type: ignore[arg-type]
    elif kind == "tokenizer-ids-beyond-vocab":
        doc = json.loads((model / "tokenizer.json").read_text())
        doc["model"]["vocab"].update(variant)  # type: ignore[arg-type]
        (model / "tokenizer.json").write_text(json.dumps(doc))
    elif kind == "missing-weight":
        _rewrite_tensors(model / "model.safetensors", drop=str(variant))
    elif kind == "escape-tensor-names":
        _rewrite_tensors(model / "model.safetensors", add=str(variant))
    elif kind == "swapped-converted-cache":
        target = cache / SMOLLM2.cache_name
        shutil.copytree(model, target)
        (target / SOURCE_FILE).write_text(json.dumps(SMOLLM2.__dict__))
        write_manifest(target)  # converted as `--model smollm2` converts, then changed
        name = str(variant)
        if name == "chat_template.jinja":
            (target / name).write_text("{{ messages[0]['content'] }}")
        elif name == "config.json":
            _edit_json(target / name, {"rms_norm_eps": 1e-5})
        else:
            data = bytearray((target / name).read_bytes())
            data[-1] ^= 1
            (target / name).write_bytes(bytes(data))
        return ["--model", "smollm2"]
    return ["--model", str(model)]


def snapshot(root: Path) -> dict[str, object]:
    out: dict[str, object] = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        out[rel] = "dir" if path.is_dir() and not path.is_symlink() else os.lstat(path).st_mtime_ns
    return out


@pytest.mark.fuzz
@pytest.mark.parametrize("kind", KINDS)
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    phases=[Phase.explicit, Phase.generate],  # no shrinking: a draw costs seconds, and each is readable as drawn
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_a_hostile_model_directory_trains_harmlessly_or_fails_in_one_line(
    tiny_model: Path, tmp_path_factory: pytest.TempPathFactory, kind: str, data: st.DataObject
) -> None:
    """Any one of issue 50's mutations of a model directory: `rl demo grpo --model` succeeds or ends in one line with
    a documented status; no traceback, raw escape, hang or unbounded memory; nothing outside read or written."""
    root = tmp_path_factory.mktemp("hostile-model")
    outside, model, cache = root / "outside", root / "model", root / "cache"
    outside.mkdir()
    (outside / "file.txt").write_text("precious\n")
    shutil.copytree(tiny_model, model)
    variant = data.draw(st.sampled_from(VARIANTS[kind]), label="variant")
    model_arg = _apply(kind, variant, model, outside, cache)
    before = snapshot(outside)  # after the attack planted its own file there
    argv = ["demo", "grpo", *model_arg, "--iterations", "1", "--prompts", "2", "--samples", "2"]
    argv += ["--out", str(root / "run")]
    env = {**os.environ, "RL_MODEL_CACHE": str(cache), "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    try:
        done = subprocess.run(
            [sys.executable, "-c", CHILD, str(outside), json.dumps(argv), str(ADDRESS_SPACE)],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            errors="surrogateescape",
            timeout=DEADLINE_S,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"{kind} {variant!r}: rl demo grpo ran past {DEADLINE_S} s")
    err = done.stderr
    report = json.loads(err.strip().splitlines()[-1]) if done.returncode == 0 and err.strip() else None
    assert report is not None, f"{kind} {variant!r}: the child died (status {done.returncode}):\n{err[-3000:]}"
    rc, shown_err = report["rc"], err.strip().rsplit("\n", 1)[0]
    assert rc in DOCUMENTED, f"{kind} {variant!r}: exited {rc}:\n{shown_err[-3000:]}"
    assert "Traceback" not in shown_err, f"{kind} {variant!r}: a traceback:\n{shown_err[-3000:]}"
    if rc != 0:
        lines = [line for line in shown_err.splitlines() if line.startswith("rl demo grpo:")]
        assert len(lines) == 1, f"{kind} {variant!r}: {len(lines)} error lines:\n{shown_err[-3000:]}"
    raw = [c for c in ("\x1b", "\x07", "\u202e") if c in shown_err + done.stdout]
    assert not raw, f"{kind} {variant!r}: raw controls {raw!r} reached the terminal"
    assert not report["read_outside"], f"{kind} {variant!r}: read {report['read_outside']} outside"
    assert snapshot(outside) == before, f"{kind} {variant!r}: something outside changed"
    assert report["peak"] < PEAK_RSS, f"{kind} {variant!r}: peak RSS {report['peak'] >> 20} MiB"
    if kind in MUST_REFUSE:
        assert rc != 0, f"{kind} {variant!r}: trained on, where it must be refused"
