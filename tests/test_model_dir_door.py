"""Issue 52: a model directory is opened and checked once, at the command's door (`rl.models.opened_model`), and every
loader below takes the `ModelDir` it returns: a file swapped in after the door's check is never loaded, and a loader
handed a plain path refuses it (`TypeError`) before it reads anything."""

from __future__ import annotations

import os
import pickle
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from rl.models import load_base_model, load_tokenizer
from rl.models.model_checks import check_run_fits_model
from rl.models.opened_model import ModelDir, checked_model, open_model
from rl.models.tiny import TinyModelConfig, build_tiny_model, check_tokenizer
from rl.samplers.adapter_cache import AdapterCache
from rl.samplers.torch_sampler import TorchSampler
from rl.samplers.vllm import VLLMEngine
from rl.samplers.vllm_requests import model_max_len
from rl.storage.artifacts import LocalArtifacts
from rl.trainer.adapter import new_adapter
from rl.trainer.config import TrainerConfig
from rl.trainer.peft_trainer import PeftTrainer

TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
SWAPPED = "swapped {% for m in messages %}{{ m['content'] }}{% endfor %}"


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    model_dir = build_tiny_model(tmp_path_factory.mktemp("door") / "model", TinyModelConfig(seed=3))
    (model_dir / "chat_template.jinja").write_text(TEMPLATE)
    return model_dir


@pytest.fixture
def copy(model: Path, tmp_path: Path) -> Path:
    return shutil.copytree(model, tmp_path / "model")


def _weights_equal(model: Any, tensors: dict[str, torch.Tensor]) -> bool:
    state = model.state_dict()
    shared = [name for name in tensors if name in state]
    assert shared  # the comparison covers the weights the file holds
    return all(torch.equal(state[name], tensors[name]) for name in shared)


def test_a_file_swapped_after_the_doors_check_is_never_loaded(copy: Path, tmp_path: Path) -> None:
    """Weights and a chat template replaced in the directory between the door and the loads (valid files, as a
    second writer or a sync would leave them): every load reads what the door checked; only a new door sees them."""
    original = load_file(copy / "model.safetensors")
    opened = open_model(copy)
    other = build_tiny_model(tmp_path / "other", TinyModelConfig(seed=4))
    swapped = load_file(other / "model.safetensors")
    assert not all(torch.equal(swapped[name], original[name]) for name in original)  # the swap changes the weights
    os.replace(other / "model.safetensors", copy / "model.safetensors")
    (copy / "chat_template.jinja").write_text(SWAPPED)

    assert _weights_equal(load_base_model(opened), original)
    assert load_tokenizer(opened).chat_template == TEMPLATE
    trainer_base = PeftTrainer(opened, LocalArtifacts(tmp_path / "artifacts"), TrainerConfig(threads=1))
    assert _weights_equal(new_adapter(trainer_base.base_dir, trainer_base.config, 0).get_base_model(), original)
    opened.close()

    reopened = open_model(copy)  # a new door reads the directory as it is now
    assert _weights_equal(load_base_model(reopened), swapped)
    assert load_tokenizer(reopened).chat_template == SWAPPED


def _loaders(tmp_path: Path) -> dict[str, Callable[[Any], object]]:
    store = LocalArtifacts(tmp_path / "store")
    return {
        "load_base_model": load_base_model,
        "load_tokenizer": load_tokenizer,
        "check_tokenizer": check_tokenizer,
        "check_run_fits_model": lambda base: check_run_fits_model(base, ["1="], 4),
        "model_max_len": model_max_len,
        "AdapterCache": AdapterCache,
        "TorchSampler": lambda base: TorchSampler(base, store),
        "PeftTrainer": lambda base: PeftTrainer(base, store),
        "new_adapter": lambda base: new_adapter(base, TrainerConfig(), 0),
        "VLLMEngine": lambda base: VLLMEngine(base, store, adapter_root=tmp_path / "adapters"),
    }


@pytest.mark.parametrize("loader", sorted(_loaders(Path("unused"))))
def test_a_lower_layer_loader_refuses_a_plain_path(loader: str, model: Path, tmp_path: Path) -> None:
    """A path (or its text) skips the door's checks: each loader refuses it with a TypeError naming the opener,
    before it reads or writes anything (the staging directory in the temp directory included)."""
    call = _loaders(tmp_path)[loader]
    for plain in (model, str(model)):
        with pytest.raises(TypeError, match="open_model"):
            call(plain)
    assert not (tmp_path / "adapters").exists()


def test_a_model_dir_is_made_only_by_its_opener_and_stays_in_its_process(model: Path) -> None:
    """The constructor refuses a caller without the opener's token; a `ModelDir` opened without its weights is
    refused by a weights loader; one cannot be pickled to another process, which opens its own."""
    with pytest.raises(TypeError, match="open_model"):
        ModelDir(model, None, weights=True, tokenizer=True, opener=object())  # type: ignore[arg-type]
    tokenizer_only = open_model(model, weights=False)
    with pytest.raises(TypeError, match="weights"):
        load_base_model(tokenizer_only)
    with pytest.raises(TypeError, match="weights"):
        checked_model(tokenizer_only, weights=True)
    with open_model(model) as opened:
        with pytest.raises(TypeError, match="open it there"):
            pickle.dumps(opened)
        assert str(opened) == str(model) and opened.absolute().where == model.absolute()
    with pytest.raises(ValueError, match="closed"), opened.staged():
        pass


def test_without_proc_each_staging_copies_the_whole_held_weights(
    model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where there is no /proc (macOS) a staging copies the held descriptor's bytes by offset, never moving the
    descriptor's position: two loads staging the one descriptor at once (the sampler's and the trainer's, pipelined)
    each get the whole file."""
    from rl.models import model_files

    with open_model(model) as opened:
        fd = opened.checked_files().weights["model.safetensors"].fd
        os.lseek(fd, 5, os.SEEK_SET)  # where another reader of the descriptor might have left it
        monkeypatch.setattr(model_files.os.path, "exists", lambda path: False)
        for name in ("a", "b"):
            model_files._hand_over(fd, tmp_path / name)
        monkeypatch.undo()
        assert os.lseek(fd, 0, os.SEEK_CUR) == 5
    expected = (model / "model.safetensors").read_bytes()
    assert (tmp_path / "a").read_bytes() == expected and (tmp_path / "b").read_bytes() == expected
