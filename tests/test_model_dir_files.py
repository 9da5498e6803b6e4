"""Issue 50: every file a model load reads goes through one checked opener (`rl.models.model_files`), and transformers
loads only the checked bytes. Each hostile directory is built by hand from the tiny model: a template linked to a
file outside, a sparse gigabyte, a FIFO, a hard link, a tensor named with escape sequences, a swap after the check."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from rl.cli import main
from rl.errors import ModelFileError
from rl.models import load_base_model, load_tokenizer
from rl.models.model_files import FILE_LIMITS
from rl.models.opened_model import open_model
from rl.models.tiny import TinyModelConfig, build_tiny_model

SECRET = "outside-secret-7f3a"
TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with a chat template file and a generation config, as a real instruct model's directory."""
    model_dir = build_tiny_model(tmp_path_factory.mktemp("files") / "model", TinyModelConfig(seed=3, max_position=256))
    (model_dir / "chat_template.jinja").write_text(TEMPLATE)
    return model_dir


@pytest.fixture
def copy(model: Path, tmp_path: Path) -> Path:
    return shutil.copytree(model, tmp_path / "model")


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    secret = tmp_path / "outside.txt"
    secret.write_text(SECRET)
    return secret


def _cli_refuses(model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], *needles: str) -> str:
    """`rl demo grpo --model DIR` ends in one line (exit 2) naming `needles`; nothing of the run is written."""
    out = tmp_path / "run"
    assert main(["demo", "grpo", "--model", str(model_dir), "--out", str(out), "--iterations", "1"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and SECRET not in err, err
    [line] = [line for line in err.splitlines() if line.startswith("rl demo grpo:")]
    assert all(needle in line for needle in needles), line
    assert not out.exists()
    return line


def test_a_template_linked_to_a_file_outside_is_refused_never_read(
    copy: Path, outside: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (copy / "chat_template.jinja").unlink()
    (copy / "chat_template.jinja").symlink_to(outside)
    with pytest.raises(ModelFileError, match=r"chat_template\.jinja is a symlink"):
        load_tokenizer(open_model(copy, weights=False))
    _cli_refuses(copy, tmp_path, capsys, "chat_template.jinja", "symlink")


def test_a_hard_link_to_a_file_outside_is_refused(copy: Path, outside: Path) -> None:
    (copy / "generation_config.json").unlink()
    os.link(outside, copy / "generation_config.json")
    with pytest.raises(ModelFileError, match="2 hard links"):
        load_base_model(open_model(copy, tokenizer=False))


def test_a_sparse_gigabyte_template_is_refused_by_its_size_before_a_byte_is_read(copy: Path) -> None:
    with open(copy / "chat_template.jinja", "r+b") as f:
        f.truncate(1 << 30)
    with pytest.raises(ModelFileError, match=rf"{1 << 30} bytes, more than the {FILE_LIMITS['chat_template.jinja']}"):
        load_tokenizer(open_model(copy, weights=False))


def test_a_fifo_at_a_files_name_is_refused_without_blocking(copy: Path) -> None:
    (copy / "chat_template.jinja").unlink()
    os.mkfifo(copy / "chat_template.jinja")
    with pytest.raises(
        ModelFileError, match="is a FIFO, not a regular file"
    ):  # no writer ever comes: a blocking open would hang
        load_tokenizer(open_model(copy, weights=False))


def test_a_tensor_named_with_escape_sequences_is_refused_and_shown_escaped(copy: Path) -> None:
    tensors = load_file(copy / "model.safetensors")
    tensors["\x1b]0;pwned\x07\x1b[2J"] = torch.zeros(1)
    save_file(tensors, copy / "model.safetensors")
    with pytest.raises(ModelFileError, match="not a module name") as caught:
        load_base_model(open_model(copy, tokenizer=False))
    assert "\x1b" not in str(caught.value) and "\x07" not in str(caught.value)


def test_a_weights_header_that_does_not_cover_the_file_is_refused(copy: Path) -> None:
    with open(copy / "model.safetensors", "ab") as f:
        f.write(b"\0" * 64)  # bytes beyond every tensor's span: not what save_pretrained writes
    with pytest.raises(ModelFileError, match="weights cannot be read"):
        load_base_model(open_model(copy, tokenizer=False))


def test_the_load_reads_the_checked_bytes_whatever_is_swapped_in_after_the_check(copy: Path, tmp_path: Path) -> None:
    """A swap between the check and transformers' read changes nothing: the staging holds the checked bytes and the
    checked weights file itself, not names in the directory."""
    original = load_file(copy / "model.safetensors")
    other = build_tiny_model(tmp_path / "other", TinyModelConfig(seed=4, max_position=256))
    with open_model(copy) as model, model.staged() as staged:
        (copy / "chat_template.jinja").write_text("{{ '" + SECRET + "' }}")
        os.replace(other / "model.safetensors", copy / "model.safetensors")
        (copy / "config.json").unlink()
        (copy / "config.json").symlink_to(tmp_path / "outside-config.json")
        assert (staged / "chat_template.jinja").read_text() == TEMPLATE
        loaded = load_file(staged / "model.safetensors")
        assert json.loads((staged / "config.json").read_text())["vocab_size"] > 0
    assert loaded.keys() == original.keys()
    assert all(torch.equal(loaded[k], original[k]) for k in original)
    assert not staged.exists()  # removed after the load


def test_files_nothing_loads_are_never_staged(copy: Path) -> None:
    """What the loaders would pick up beside the known files (extra templates, code, a pickle) is left behind."""
    (copy / "additional_chat_templates").mkdir()
    (copy / "additional_chat_templates" / "tool.jinja").write_text(SECRET)
    (copy / "modeling_evil.py").write_text("raise SystemExit('ran')")
    (copy / "pytorch_model.bin").write_bytes(b"\x80\x04K\x01.")
    with open_model(copy) as model, model.staged() as staged:
        names = set(os.listdir(staged))
    assert names <= {*FILE_LIMITS, "model.safetensors"}
    assert "chat_template.jinja" in names and "config.json" in names
