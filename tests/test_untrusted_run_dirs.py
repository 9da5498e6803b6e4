"""A run directory someone sent is input, not trusted state: nothing in it may make a command read or write outside it.

Each test crafts what a hostile (or damaged) run directory could hold, a manifest, a symlink where a directory was, an
artifact object that links elsewhere, and checks the store refuses it with an error naming the culprit, and that
nothing outside the directory was created or read.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rl.cli import main
from rl.errors import (
    ArtifactCorruptError,
    InvalidPathError,
    UnsafeRunDirError,
    VersionNotFoundError,
    VolumeCorruptedError,
)
from rl.storage.artifacts import LocalArtifacts, compute_digest
from rl.storage.volumes.buffer import VolumeBuffer, rollout_rows
from rl.storage.volumes.filesystem import force_rmtree
from rl.storage.volumes.manifest import digest
from rl.storage.volumes.rollout_buffer import BUFFER_NAME
from rl.storage.volumes.store import LocalVolumeStore
from rl.types import ArtifactRef, Rollout


def _rollout(group: int) -> Rollout:
    return Rollout(group, "3+1=", "4", "4", [1, 2], [3], [-0.5], 0, group)


def _run_dir(root: Path) -> tuple[Path, LocalVolumeStore]:
    """A run directory holding a one-iteration rollout buffer, as `rl demo grpo` leaves it."""
    run = root / "run"
    store = LocalVolumeStore(run / "volumes", durable=False)
    VolumeBuffer(store, BUFFER_NAME).append(0, rollout_rows(0, [_rollout(0), _rollout(1)], [1.0, 0.0]))
    return run, store


def _forge(store: LocalVolumeStore, *, dirs=(), files=None, symlinks=None, message=None, rehash=True) -> str:
    """Publish a copy of the store's latest version with extra manifest entries, its id recomputed as a forger would."""
    head = store.versions()[-1]
    manifest = head.manifest
    manifest["dirs"] = sorted({*manifest["dirs"], *dirs})
    for rel, entry in (files or {}).items():
        manifest["files"][rel] = entry
        manifest["mtimes_ns"][rel] = 0
    manifest["symlinks"].update(symlinks or {})
    if message is not None:
        manifest["message"] = message
    tree = {k: manifest[k] for k in ("files", "dirs", "symlinks")}
    if rehash:
        manifest["content_digest"] = digest(tree)
        identity = {k: manifest[k] for k in ("format", "name", "parent", "message", "content_digest")}
        manifest["version"] = digest(identity)
    else:
        manifest["version"] = digest({"forged": message})
    manifest["published_at_ns"] += 1  # the newest: the buffer's head
    target = store.root / "versions" / manifest["version"]
    shutil.copytree(head.path(), target / "data")
    (target / "manifest.json").write_text(json.dumps(manifest))
    return manifest["version"]


def _hostile_entries(outside: Path) -> dict[str, dict]:
    """Manifest additions that would create something outside the volume (or link there) if a fork trusted them."""
    entry = {"sha256": "0" * 64, "size": 0, "executable": False}
    return {
        "absolute directory": {"dirs": [str(outside / "made-by-fork")]},
        "directory above the store": {"dirs": ["../../../../made-by-fork"]},
        "symlink to an absolute path": {"symlinks": {"link": str(outside)}},
        "symlink climbing out": {"symlinks": {"link": "../../../.."}},
        "'..' after a name that may be a link": {"symlinks": {"here": ".", "link": "here/.."}},
        "directory through a symlink": {"symlinks": {"link": str(outside)}, "dirs": ["link/made-by-fork"]},
        "file through a symlink": {"symlinks": {"link": str(outside)}, "files": {"link/x": entry}},
        "non-canonical path": {"dirs": ["a//b", "a"]},
    }


@settings(max_examples=16, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_forked_version_never_creates_anything_outside_its_volume(tmp_path_factory, data):
    """Every manifest entry passes a write's rules before a fork materialises it, even when the id was recomputed."""
    root = tmp_path_factory.mktemp("crafted")
    outside = root / "outside"
    outside.mkdir()
    run, store = _run_dir(root)
    kind = data.draw(st.sampled_from(sorted(_hostile_entries(outside))), label="hostile entry")
    version = _forge(store, **_hostile_entries(outside)[kind])
    before = sorted(p.name for p in root.iterdir())
    fresh = LocalVolumeStore(run / "volumes", durable=False)  # reads the manifest from disk, as `rl rescore` does
    with pytest.raises(VolumeCorruptedError, match=version) as info:
        fresh.open(version).fork("copy")
    assert "retry" in str(info.value)  # says what to do
    assert list(outside.iterdir()) == [] and sorted(p.name for p in root.iterdir()) == before


def test_rescore_of_a_crafted_run_directory_writes_nothing_outside_it(tmp_path):
    """`rl rescore DIR` on a buffer whose head names an absolute directory fails before creating it."""
    outside = tmp_path / "outside"
    outside.mkdir()
    run, store = _run_dir(tmp_path)
    _forge(store, dirs=[str(outside / "made-by-rescore")])
    try:
        rc = main(["rescore", str(run), "--reward", "format"])
    except VolumeCorruptedError:
        rc = None
    assert rc != 0
    assert list(outside.iterdir()) == []


def test_a_manifest_edited_after_finalize_is_refused_by_its_version_id(tmp_path):
    """The version id is recomputed from the manifest: an edit that keeps the id is caught and the version named."""
    _, store = _run_dir(tmp_path)
    version = store.versions()[-1].version
    path = store.root / "versions" / version / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["message"] = "iteration 99"
    os.chmod(path, 0o644)
    path.write_text(json.dumps(manifest))
    with pytest.raises(VolumeCorruptedError, match=rf"{version}.*version id.*restore it"):
        LocalVolumeStore(store.root, durable=False).open(version)


def test_finalize_refuses_a_symlink_that_leaves_the_volume(tmp_path):
    """A write may not create what a read would refuse: a symlink out of the volume is refused at finalize."""
    store = LocalVolumeStore(tmp_path / "store", durable=False)
    with store.new("world") as rw:
        os.symlink(tmp_path, rw.mount() / "out")
        with pytest.raises(InvalidPathError, match="out"):
            rw.finalize("escape")
    with store.new("world") as rw:
        (rw.mount() / "bin").mkdir()
        os.symlink("../bin", rw.mount() / "bin" / "self")  # inside: allowed
        assert rw.finalize("ok").symlinks == {"bin/self": "../bin"}


def test_a_version_whose_files_were_swapped_for_a_symlink_is_not_read_through(tmp_path):
    """A data directory replaced by a link to someone's files: reading the buffer refuses instead of following it."""
    outside = tmp_path / "outside"
    _, store = _run_dir(tmp_path)
    head = store.versions()[-1]
    shutil.copytree(head.path(), outside)  # the same bytes, so only the link gives it away
    os.chmod(head.path().parent, 0o755)
    force_rmtree(head.path())
    os.symlink(outside, head.path())
    buffer = VolumeBuffer(LocalVolumeStore(store.root, durable=False), BUFFER_NAME)
    with pytest.raises(VolumeCorruptedError, match="outside"):
        buffer.read(head.version)
    with pytest.raises(VolumeCorruptedError, match="symlink"):
        buffer.head().fork("copy")


def test_a_store_whose_staging_directory_is_a_symlink_is_refused(tmp_path):
    """Staging is where abandoned writers are deleted: a link there would delete someone's files."""
    victim = tmp_path / "victim"
    (victim / "keep").mkdir(parents=True)
    (tmp_path / "store").mkdir()
    os.symlink(victim, tmp_path / "store" / "staging")
    with pytest.raises(VolumeCorruptedError, match="symlink"):
        LocalVolumeStore(tmp_path / "store", durable=False).discard_abandoned()
    assert (victim / "keep").is_dir()


def test_rescore_refuses_a_run_directory_whose_volumes_lead_elsewhere(tmp_path):
    """`volumes` linked to another store: rescore writes no version there."""
    _, store = _run_dir(tmp_path / "a")
    run = tmp_path / "run"
    run.mkdir()
    os.symlink(store.root, run / "volumes")
    before = sorted(os.listdir(store.root / "versions"))
    try:
        rc = main(["rescore", str(run), "--reward", "format"])
    except UnsafeRunDirError:
        rc = None
    assert rc != 0
    assert sorted(os.listdir(store.root / "versions")) == before


@pytest.mark.asyncio
async def test_an_artifact_object_that_links_elsewhere_is_not_read(tmp_path):
    """A crafted `objects/<digest>` symlink to a directory with matching bytes is refused, not read."""
    files = {"adapter.bin": b"weights"}
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "adapter.bin").write_bytes(files["adapter.bin"])
    store = LocalArtifacts(tmp_path / "artifacts")
    ref = ArtifactRef(uri="", digest=compute_digest(files))
    os.symlink(outside, store.root / "objects" / ref.digest.removeprefix("sha256:"))
    with pytest.raises(ArtifactCorruptError, match="symlink"):
        await store.get(ref)


@pytest.mark.parametrize("entry", ["metrics.jsonl", "checkpoint.json", "artifacts", "volumes"])
def test_a_run_directory_entry_that_is_a_symlink_is_refused_before_anything_is_written(tmp_path, entry):
    """The report, checkpoint and stores are written through: a link in their place is refused at start."""
    from rl.storage.run_layout import require_safe

    target = tmp_path / "victim"
    target.mkdir()
    run = tmp_path / "run"
    run.mkdir()
    os.symlink(target, run / entry)
    with pytest.raises(UnsafeRunDirError, match=entry):
        require_safe(run)
    assert list(target.iterdir()) == []


@pytest.mark.parametrize("crafted", ["../../../etc", "/etc", "rollouts/../../x", "0" * 63 + "/"])
def test_a_checkpoint_buffer_version_is_looked_up_never_used_as_a_path(tmp_path, crafted):
    """The buffer version a checkpoint names goes through the store's id and name rules; a path is never opened."""
    _, store = _run_dir(tmp_path)
    with pytest.raises(VersionNotFoundError):
        store.open(crafted)
