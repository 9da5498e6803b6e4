"""The base model appears in a run directory whole or not at all: a kill mid-build never leaves it unusable."""

from __future__ import annotations

import fcntl
import os

import pytest

import rl.deploy.local
from rl.deploy.local import DEMO_MODEL, base_model
from rl.models import load_base_model, load_tokenizer
from rl.storage.run_dir import discard_abandoned_bases

_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


class Killed(BaseException):
    """Stands in for SIGKILL: nothing after it in the builder runs."""


def test_a_kill_mid_build_leaves_no_half_model_and_the_next_start_builds_it(tmp_path, monkeypatch):
    """The builder dies after writing config.json but before the weights; the next start gets a loadable model."""
    real_build = rl.deploy.local.build_tiny_model

    def killed_mid_write(out_dir, config):
        real_build(out_dir, config)
        (out_dir / "model.safetensors").unlink()  # the weights were still being written
        raise Killed

    monkeypatch.setattr(rl.deploy.local, "build_tiny_model", killed_mid_write)
    with pytest.raises(Killed):
        base_model(tmp_path, DEMO_MODEL)
    assert not list(tmp_path.glob("base-*"))  # nothing published
    monkeypatch.setattr(rl.deploy.local, "build_tiny_model", real_build)
    base = base_model(tmp_path, DEMO_MODEL)
    assert all((base.where / name).is_file() for name in _FILES)
    load_base_model(base) and load_tokenizer(base)


def test_a_half_built_base_model_from_an_older_version_is_rebuilt_identically(tmp_path):
    """A `base-*` missing its weights (built in place, then killed) heals at the next start, byte for byte."""
    complete = base_model(tmp_path / "a", DEMO_MODEL).where
    half = tmp_path / "b" / complete.name
    half.mkdir(parents=True)
    (half / "config.json").write_bytes((complete / "config.json").read_bytes())
    assert base_model(tmp_path / "b", DEMO_MODEL).where == half
    assert all((half / n).read_bytes() == (complete / n).read_bytes() for n in _FILES)


def test_a_dead_builders_staging_directory_is_deleted_and_a_live_ones_kept(tmp_path):
    """Staging left by a killed builder goes at the next start; one a live builder holds stays."""
    dead = tmp_path / f".base-{'a' * 12}.staging-{'0' * 32}"
    live = tmp_path / f".base-{'a' * 12}.staging-{'1' * 32}"
    other = tmp_path / ".base-mine"
    for d in (dead, live, other):
        (d / "sub").mkdir(parents=True)
        os.chmod(d / "sub", 0o555)
    fd = os.open(live, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        assert discard_abandoned_bases(tmp_path) == [dead.name]
    finally:
        os.close(fd)
    assert not dead.exists() and live.is_dir() and other.is_dir()
