"""Issue 50: a model directory's files are compared with each other, and with the run, before anything is allocated
(`rl.models.model_checks`): each hostile directory below is the tiny model with one file edited by hand, and each ends
in one line naming the field, through the API and through `rl demo grpo --model` (exit 2, no traceback)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from rl.cli import main
from rl.errors import ModelMismatchError, PlanDoesNotFitError
from rl.models import load_base_model, load_tokenizer
from rl.models.model_checks import check_model_files
from rl.models.model_files import open_model_dir
from rl.models.opened_model import open_model
from rl.models.tiny import TinyModelConfig, build_tiny_model

TEMPLATE = "{% for m in messages %}user: {{ m['content'] }}\n{% endfor %}assistant:"


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    model_dir = build_tiny_model(tmp_path_factory.mktemp("checks") / "model", TinyModelConfig(seed=3, max_position=256))
    (model_dir / "chat_template.jinja").write_text(TEMPLATE)
    return model_dir


@pytest.fixture
def copy(model: Path, tmp_path: Path) -> Path:
    return shutil.copytree(model, tmp_path / "model")


def _edit(path: Path, **change: Any) -> None:
    doc = json.loads(path.read_text()) if path.exists() else {}
    path.write_text(json.dumps({**doc, **change}))


def _cli_refuses(model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], *needles: str) -> None:
    out = tmp_path / "run"
    assert main(["demo", "grpo", "--model", str(model_dir), "--out", str(out), "--iterations", "1"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    [line] = [line for line in err.splitlines() if line.startswith("rl demo grpo:")]
    assert all(needle in line for needle in needles), line
    assert not out.exists()


def test_the_tiny_model_passes_every_check(model: Path) -> None:
    checked = open_model_dir(model)
    check_model_files(checked)
    checked.close()


def test_a_config_describing_a_terabyte_beside_a_tiny_weights_file_is_refused_before_allocating(
    copy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each size within bounds, together ~1 TB of float32: refused by comparing with the headers, not by memory."""
    save_file({"model.embed_tokens.weight": torch.zeros(1)}, copy / "model.safetensors")
    _edit(copy / "config.json", hidden_size=16384, intermediate_size=53248, num_hidden_layers=128, vocab_size=131072)
    with pytest.raises(ModelMismatchError, match=r"describes .* parameters .* its weights files hold 1:"):
        load_base_model(open_model(copy, tokenizer=False))
    _cli_refuses(copy, tmp_path, capsys, "describes", "parameters", "hidden_size")


def test_weights_larger_than_the_memory_budget_are_refused_by_the_plan(model: Path) -> None:
    checked = open_model_dir(model)
    try:
        with pytest.raises(PlanDoesNotFitError, match="GiB at 4 bytes each"):
            check_model_files(checked, budget=1000)  # the tiny model's float32 weights: ~300 KB
    finally:
        checked.close()


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"num_key_value_heads": 3}, "not a multiple of its num_key_value_heads (3)"),
        ({"head_dim": 5}, "head_dim (5) is odd"),
        ({"head_dim": 32}, "q_proj.weight has shape"),  # declared, but not the weights' shape
    ],
)
def test_heads_and_head_dim_that_do_not_fit_are_refused_naming_the_field(
    copy: Path, change: dict[str, int], needle: str
) -> None:
    _edit(copy / "config.json", **change)
    with pytest.raises(ModelMismatchError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        load_base_model(open_model(copy, tokenizer=False))


def test_heads_that_do_not_divide_end_the_cli_in_one_line(
    copy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _edit(copy / "config.json", num_key_value_heads=3)
    _cli_refuses(copy, tmp_path, capsys, "num_key_value_heads (3)")


@pytest.mark.parametrize(
    ("file", "change", "needle"),
    [
        ("config.json", {"eos_token_id": 10_000}, "config.json's eos_token_id has id 10000"),
        ("generation_config.json", {"eos_token_id": [1, 99_999]}, "generation_config.json's eos_token_id"),
    ],
)
def test_a_token_id_past_the_vocabulary_is_refused(copy: Path, file: str, change: dict[str, Any], needle: str) -> None:
    _edit(copy / file, **change)
    with pytest.raises(ModelMismatchError, match=needle):
        load_base_model(open_model(copy, tokenizer=False))


def test_an_added_token_past_the_vocabulary_ends_the_cli_in_one_line(
    copy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tokenizer = json.loads((copy / "tokenizer.json").read_text())
    tokenizer["added_tokens"].append({**tokenizer["added_tokens"][0], "id": 1 << 19, "content": "<evil>"})
    (copy / "tokenizer.json").write_text(json.dumps(tokenizer))
    with pytest.raises(ModelMismatchError, match="added token '<evil>' has id 524288"):
        load_tokenizer(open_model(copy, weights=False))
    _cli_refuses(copy, tmp_path, capsys, "<evil>", "vocab_size")


def test_a_missing_weight_is_an_error_never_a_random_initialisation(
    copy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tensors = load_file(copy / "model.safetensors")
    norm = "model.layers.1.post_attention_layernorm.weight"
    del tensors[norm]
    tensors["model.extra.weight"] = torch.zeros(64)  # the count still adds up: only the names tell
    save_file(tensors, copy / "model.safetensors")
    with pytest.raises(ModelMismatchError, match=f"lack 1 of the .* tensors .*{norm}"):
        load_base_model(open_model(copy, tokenizer=False))
    _cli_refuses(copy, tmp_path, capsys, norm, "random values")


def test_tied_embeddings_need_no_output_layer_in_the_files(copy: Path) -> None:
    tensors = load_file(copy / "model.safetensors")
    del tensors["lm_head.weight"]
    save_file(tensors, copy / "model.safetensors")
    with pytest.raises(ModelMismatchError, match=r"lm_head\.weight"):
        load_base_model(open_model(copy, tokenizer=False))
    _edit(copy / "config.json", tie_word_embeddings=True)
    model = load_base_model(open_model(copy, tokenizer=False))
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"temperature": "hot"}, "temperature is 'hot', not a number"),
        ({"max_new_tokens": [1]}, r"max_new_tokens is \[1\], not an integer"),
        ({"do_sample": "yes"}, "do_sample is 'yes', not true or false"),
    ],
)
def test_a_generation_config_of_the_wrong_types_is_a_typed_error(
    copy: Path, change: dict[str, Any], needle: str
) -> None:
    _edit(copy / "generation_config.json", **change)
    with pytest.raises(ModelMismatchError, match=needle):
        load_base_model(open_model(copy, tokenizer=False))


def test_a_malformed_generation_config_ends_the_cli_in_one_line(
    copy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (copy / "generation_config.json").write_text("[1, 2]")
    _cli_refuses(copy, tmp_path, capsys, "generation_config.json is not a JSON object")


def test_a_context_shorter_than_prompt_and_completion_is_refused_before_the_run(
    copy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _edit(copy / "config.json", max_position_embeddings=20)  # rotary positions: no weight depends on it
    _cli_refuses(copy, tmp_path, capsys, "max_position_embeddings (20)", "longest prompt")
