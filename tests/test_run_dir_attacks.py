"""What a run directory someone sent you cannot do (issue 39's classes): write through a hard link or a device, block a
read or a write on a FIFO or socket, size memory by a claimed number, or put escape sequences on a terminal. Each test
builds the attack by hand and checks the one layer every caller goes through (`rl.storage.safe_fs.Tree`,
`rl.errors.shown`)."""

from __future__ import annotations

import os
import signal
import socket
import stat
from pathlib import Path

import pytest

from rl.commands import failures
from rl.errors import UnsafeRunDirError, shown
from rl.models.opened_model import open_model
from rl.storage.safe_fs import Tree

WRITE_MODES = ["w", "a", "wb", "ab", "r+", "w+"]


class Hung(Exception):
    """An open blocked: the refusal this file tests did not come first."""


@pytest.fixture(autouse=True)
def deadline():  # type: ignore[no-untyped-def]
    """A test that blocks (a FIFO opened without O_NONBLOCK) fails after 20 s instead of hanging the session."""

    def hung(*_: object) -> None:
        raise Hung("blocked for 20 s")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(20)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    f = tmp_path / "outside.txt"
    f.write_text("precious\n")
    return f


@pytest.mark.parametrize("mode", WRITE_MODES)
def test_a_write_through_a_hard_link_is_refused_before_a_byte_changes(tmp_path: Path, outside: Path, mode: str) -> None:
    """docs/guarantees.md: "Every file the tool writes in a run directory is a regular file with one link": a hard
    link to a file outside, planted at metrics.jsonl, is refused and the outside file keeps its bytes."""
    run = tmp_path / "run"
    run.mkdir()
    os.link(outside, run / "metrics.jsonl")
    with pytest.raises(UnsafeRunDirError, match="2 hard links"):
        Tree(run).open_file(run / "metrics.jsonl", mode)
    assert outside.read_text() == "precious\n"


@pytest.mark.parametrize("flags", [os.O_WRONLY | os.O_CREAT | os.O_TRUNC, os.O_RDWR | os.O_CREAT])
def test_a_lock_file_hard_linked_outside_is_refused(tmp_path: Path, outside: Path, flags: int) -> None:
    """The lock files (`Tree.open` with O_RDWR, then truncated and written) go through the same check."""
    run = tmp_path / "run"
    run.mkdir()
    os.link(outside, run / ".rl-writer")
    with pytest.raises(UnsafeRunDirError):
        Tree(run).open(run / ".rl-writer", flags)
    assert outside.read_text() == "precious\n"


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _socket(path: Path) -> None:
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(path))
    s.close()  # the socket file stays; nothing listens


@pytest.mark.parametrize("make", [_fifo, _socket], ids=["fifo", "socket"])
@pytest.mark.parametrize("mode", ["r", "rb", *WRITE_MODES])
def test_a_fifo_or_socket_is_refused_without_blocking(tmp_path: Path, make, mode: str) -> None:  # type: ignore[no-untyped-def]
    """docs/guarantees.md: "A FIFO, socket or device where a file goes is refused before it can block": opening a FIFO
    with no writer (or no reader) would wait forever; here it is refused at once, for reading and for writing."""
    run = tmp_path / "run"
    run.mkdir()
    make(run / "report.html")
    with pytest.raises(UnsafeRunDirError, match=r"FIFO|socket"):
        Tree(run).open_file(run / "report.html", mode)


@pytest.mark.skipif(os.geteuid() != 0, reason="creating a device node needs root (mknod); not root here")
@pytest.mark.parametrize("mode", ["r", *WRITE_MODES])
def test_a_device_node_is_refused(tmp_path: Path, mode: str) -> None:
    run = tmp_path / "run"
    run.mkdir()
    os.mknod(run / "metrics.jsonl", stat.S_IFCHR | 0o666, os.makedev(1, 3))  # /dev/null's numbers
    with pytest.raises(UnsafeRunDirError, match="device"):
        Tree(run).open_file(run / "metrics.jsonl", mode)


def test_a_directory_where_a_file_goes_is_refused(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "checkpoint.json").mkdir(parents=True)
    with pytest.raises(UnsafeRunDirError, match="directory"):
        Tree(run).open_file(run / "checkpoint.json", "r")
    with pytest.raises(IsADirectoryError):
        Tree(run).open_file(run / "checkpoint.json", "w")


@pytest.mark.parametrize("mode", ["w", "a", "x"])
def test_an_ordinary_file_is_still_written(tmp_path: Path, mode: str) -> None:
    """The check refuses nothing this tool makes: a new file, or one it wrote before (truncated only by "w")."""
    Tree(tmp_path).open_file(tmp_path / "old", "w").close() if mode != "x" else None
    if mode != "x":
        (tmp_path / "old").write_text("old\n")
    with Tree(tmp_path).open_file(tmp_path / "old", mode) as f:
        f.write("new\n")
    assert (tmp_path / "old").read_text() == {"w": "new\n", "a": "old\nnew\n", "x": "new\n"}[mode]


HOSTILE = "ok\x1b]0;pwned\x07\x1b[2J\rall checks passed\u202e\udcff"


def test_shown_leaves_no_control_character_and_cuts_long_values() -> None:
    text = shown(HOSTILE + "x" * 1000)
    assert text.isprintable() and "\\x1b]0;pwned\\x07" in text and "\\u202e" in text and "\\udcff" in text
    assert len(text) < 300 and text.endswith("more characters)")
    assert shown("a\nb", keep="\n") == "a\nb"


def test_a_symlinked_checkpoint_whose_target_holds_escapes_prints_them_visibly(tmp_path: Path) -> None:
    """docs/guarantees.md: "A path or value read from a run directory reaches a terminal, a log or the report only
    through one escaping function": the error line of a crafted symlink shows its escape sequences as text."""
    from rl.storage.run_layout import require_safe

    run = tmp_path / "run"
    run.mkdir()
    os.symlink(HOSTILE, run / "checkpoint.json")
    with pytest.raises(UnsafeRunDirError) as info:
        require_safe(run)
    line = failures.describe(info.value)
    assert line.isprintable() and "\\x1b]0;pwned" in line


def test_every_error_line_is_printable_whatever_raised_it() -> None:
    """The terminal's one sink (`rl.commands.failures`) escapes what a raiser forgot to."""
    for exc in (UnsafeRunDirError(HOSTILE), FileNotFoundError(2, "No such file", HOSTILE), ValueError(HOSTILE)):
        assert failures.describe(exc).isprintable(), exc


def test_a_sparse_file_in_an_artifact_is_refused_without_being_read_whole(tmp_path: Path) -> None:
    """A stored adapter grown to a 64 MiB sparse file is refused (exit 4) with a few MiB of Python memory,
    where reading it whole before hashing took all 64."""
    import asyncio
    import tracemalloc

    from rl.errors import ArtifactCorruptError
    from rl.storage.artifacts import LocalArtifacts

    store = LocalArtifacts(tmp_path / "artifacts")
    ref = asyncio.run(store.put({"adapter_model.safetensors": b"weights"}, name="adapter"))
    target = store.root / "objects" / ref.digest.removeprefix("sha256:") / "adapter_model.safetensors"
    os.chmod(target, 0o644)
    os.truncate(target, 64 << 20)
    tracemalloc.start()
    try:
        with pytest.raises(ArtifactCorruptError) as info:
            asyncio.run(store.get(ref))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert info.value.exit_code == 4
    assert peak < 16 << 20, f"peak {peak / 2**20:.0f} MiB"


# -- model and adapter directories ------------------------------------------------------------------------------------

# SmolLM2-135M's config.json (a llama), as the hub ships it: what the model-directory check must keep accepting.
SMOLLM2_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "bos_token_id": 0,
    "eos_token_id": 0,
    "hidden_act": "silu",
    "hidden_size": 576,
    "initializer_range": 0.041666666666666664,
    "intermediate_size": 1536,
    "max_position_embeddings": 8192,
    "model_type": "llama",
    "num_attention_heads": 9,
    "num_hidden_layers": 30,
    "num_key_value_heads": 3,
    "rms_norm_eps": 1e-05,
    "rope_scaling": None,
    "rope_theta": 100000,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "vocab_size": 49152,
}


@pytest.fixture(scope="module")
def tiny_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from rl.models import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("base") / "base")


def _config_of(base: Path) -> dict[str, object]:
    import json

    return json.loads((base / "config.json").read_text())


def test_real_model_configs_pass_the_model_directory_check(tiny_base: Path) -> None:
    from rl.models.model_dir import check_model_config
    from rl.models.qwen3 import QWEN3_8B, qwen3_config

    for config in (SMOLLM2_CONFIG, _config_of(tiny_base), qwen3_config(QWEN3_8B).to_dict()):
        check_model_config(config, "model")


@pytest.mark.parametrize(
    ("change", "refusal"),
    [
        ({"model_type": "evil", "auto_map": {"AutoModelForCausalLM": "evil.EvilModel"}}, "model_type 'evil'"),
        ({"auto_map": {"AutoConfig": "evil.EvilConfig"}}, "names code to run"),
        ({"model_type": None}, "model_type None"),
        ({"vocab_size": 10**12}, "vocab_size"),
        ({"num_hidden_layers": True}, "num_hidden_layers"),
        ({"hidden_size": "64"}, "hidden_size"),
    ],
)
def test_a_config_this_tool_would_not_write_is_refused_by_name(change: dict[str, object], refusal: str) -> None:
    """docs/guarantees.md: "config.json and adapter_config.json are checked against what this tool writes": a known
    model_type, no code to import, every size an integer within bounds."""
    from rl.errors import ModelDirError
    from rl.models.model_dir import check_model_config

    with pytest.raises(ModelDirError, match=refusal):
        check_model_config({**SMOLLM2_CONFIG, **change}, "model")


def test_a_model_directory_naming_code_never_runs_it_nor_asks(tmp_path: Path, tiny_base: Path) -> None:
    """docs/guarantees.md: "Nothing executes code from a model or adapter directory, and nothing asks": a base model
    whose config.json has an unknown model_type and an auto_map to a Python file beside it is refused in one line
    (exit 2); the file never runs. Before, transformers asked 'run the custom code? [y/N]' on a terminal, and
    without one raised a ValueError (exit 70)."""
    import json
    import shutil

    from rl.errors import ModelDirError
    from rl.models import load_base_model

    base = tmp_path / "base"
    shutil.copytree(tiny_base, base)
    ran = tmp_path / "ran"
    (base / "evil.py").write_text(f"open({str(ran)!r}, 'w').close()\n")
    config = {**_config_of(base), "model_type": "evil", "auto_map": {"AutoModelForCausalLM": "evil.EvilModel"}}
    (base / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelDirError, match="model_type 'evil'") as info:
        load_base_model(open_model(base, tokenizer=False))
    assert info.value.exit_code == 2 and not ran.exists()


def test_a_damaged_base_weights_file_is_a_typed_error(tmp_path: Path, tiny_base: Path) -> None:
    """docs/guarantees.md: "Every loader error becomes a typed error that names the file": a model.safetensors whose
    header claims 2**40 bytes ends in exit 2 naming the directory, not in SafetensorError's traceback."""
    import shutil

    from rl.errors import ModelDirError
    from rl.models import load_base_model

    base = tmp_path / "base"
    shutil.copytree(tiny_base, base)
    with open(base / "model.safetensors", "r+b") as f:
        f.write((1 << 40).to_bytes(8, "little"))
    with pytest.raises(ModelDirError, match="weights cannot be read") as info:
        load_base_model(open_model(base, tokenizer=False))
    assert str(base) in str(info.value)


@pytest.fixture(scope="module")
def adapter(tiny_base: Path) -> dict[str, bytes]:
    from rl.trainer.adapter import adapter_files, new_adapter
    from rl.trainer.config import TrainerConfig

    return adapter_files(new_adapter(open_model(tiny_base, tokenizer=False), TrainerConfig(), 0))


def _with_config(files: dict[str, bytes], **change: object) -> dict[str, bytes]:
    import json

    return {**files, "adapter_config.json": json.dumps({**json.loads(files["adapter_config.json"]), **change}).encode()}


def _hostile_adapters(files: dict[str, bytes]) -> dict[str, dict[str, bytes]]:
    weights = files["adapter_model.safetensors"]
    return {
        "regex target_modules": _with_config(files, target_modules="(a+)+$"),
        "regex in a list": _with_config(files, target_modules=["q_proj", ".*"]),
        "rank_pattern": _with_config(files, rank_pattern={"(a|aa)+": 4}),
        "megatron_config": _with_config(files, megatron_config={"x": 1}),
        "huge rank": _with_config(files, r=10**9),
        "not LORA": _with_config(files, peft_type="PROMPT_TUNING"),
        "a pickle": {**files, "adapter_model.bin": b"\x80\x04K\x01."},
        "header of 2**40": {**files, "adapter_model.safetensors": (1 << 40).to_bytes(8, "little") + weights[8:]},
        # Below safetensors' 100 MiB cap on a header, past the file's end: the file's size bounds it, not a constant.
        "header of 1 MiB": {**files, "adapter_model.safetensors": (1 << 20).to_bytes(8, "little") + weights[8:]},
        "header one byte past the end": {
            **files,
            "adapter_model.safetensors": (len(weights) - 7).to_bytes(8, "little") + weights[8:],
        },
        "empty weights": {**files, "adapter_model.safetensors": b""},
    }


def test_the_adapter_this_tool_writes_passes_and_every_hostile_one_is_refused(adapter: dict[str, bytes]) -> None:
    """Plain module names, never a regex (PEFT matches a string as one, and a pathological one hung at full CPU); a
    known rank; no pattern or code key; safetensors only, with a header that fits the file."""
    from rl.errors import AdapterDirError
    from rl.models.model_dir import check_adapter_files

    check_adapter_files("adapter", adapter)
    for name, files in _hostile_adapters(adapter).items():
        with pytest.raises(AdapterDirError):
            check_adapter_files("adapter", files)
        assert name


@pytest.mark.parametrize(
    "hostile", ["regex target_modules", "a pickle", "header of 2**40", "header of 1 MiB", "rank_pattern"]
)
def test_the_sampler_and_the_trainer_refuse_a_hostile_adapter_in_one_typed_line(
    tmp_path: Path, tiny_base: Path, adapter: dict[str, bytes], hostile: str
) -> None:
    """Both loaders (the sampler's adapter cache, the trainer's `load_policy`) go through the check: exit 4, the
    adapter named, where a pickle or a 2**40-byte header ended in exit 70 and a regex hung."""
    from rl.errors import AdapterDirError
    from rl.samplers.adapter_cache import AdapterCache
    from rl.trainer.adapter import load_policy

    files = _hostile_adapters(adapter)[hostile]
    adapter_dir = tmp_path / "adapter"
    adapter_dir.mkdir()
    for name, content in files.items():
        (adapter_dir / name).write_bytes(content)
    with pytest.raises(AdapterDirError) as info:
        AdapterCache(open_model(tiny_base, tokenizer=False)).load_dir("k", adapter_dir)
    assert info.value.exit_code == 4 and str(adapter_dir) in str(info.value)
    with pytest.raises(AdapterDirError):
        load_policy(open_model(tiny_base, tokenizer=False), files, trainable=False)


def test_a_bounded_read_refuses_by_size_before_reading(tmp_path: Path) -> None:
    """docs/guarantees.md: "A file's size is checked against a limit, or the file streamed into its digest, before it
    is read": `Tree.read_bytes(limit=...)` (the checkpoint, the buffer's files, a model's JSON) refuses a 64 MiB sparse
    file by its size: no byte is read, where reading `limit + 1` bytes first cost the limit in memory."""
    import tracemalloc

    big = tmp_path / "iter-00000.jsonl"
    big.touch()
    os.truncate(big, 64 << 20)
    tracemalloc.start()
    try:
        with pytest.raises(OverflowError):
            Tree(tmp_path).read_bytes(big, limit=32 << 20)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, f"peak {peak / 2**20:.1f} MiB"


def test_a_model_json_file_grown_to_gigabytes_is_refused_by_size(tmp_path: Path, tiny_base: Path) -> None:
    import shutil

    from rl.errors import ModelDirError
    from rl.models.model_dir import check_model_dir

    base = tmp_path / "base"
    shutil.copytree(tiny_base, base)
    os.truncate(base / "tokenizer.json", 1 << 30)
    with pytest.raises(ModelDirError, match=r"tokenizer\.json holds more than"):
        check_model_dir(base, tokenizer=True)


def test_a_tokenizer_config_emptied_is_a_typed_error(tmp_path: Path, tiny_base: Path) -> None:
    """Found by the fuzzer (a file for a directory, written `{}`): a tokenizer with no end-of-sequence token was a
    ValueError from the sampler (exit 70); it is the model directory's fault, exit 2."""
    import shutil

    from rl.errors import ModelDirError
    from rl.models import load_tokenizer

    base = tmp_path / "base"
    shutil.copytree(tiny_base, base)
    # Both files that can name it (transformers 4.56 still finds it in special_tokens_map.json alone).
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        (base / name).write_text("{}")
    with pytest.raises(ModelDirError, match="end-of-sequence"):
        load_tokenizer(open_model(base, weights=False))
