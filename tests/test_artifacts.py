"""LocalArtifacts: content addressing, copy semantics, atomic writes, typed errors for missing or corrupt artifacts."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

import pytest

from rl.errors import ArtifactCorruptError, ArtifactNotFoundError, InvalidArtifactError
from rl.protocols import Artifacts
from rl.storage.artifacts import LocalArtifacts, compute_digest, materialize, put_dir
from rl.types import ArtifactRef

FILES = {"adapter_config.json": b'{"r": 4}', "adapter_model.safetensors": b"\x00\x01weights", "sub/notes.txt": b"hi"}


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(coro)


def test_local_artifacts_implements_the_protocol(tmp_path: Path) -> None:
    assert isinstance(LocalArtifacts(tmp_path), Artifacts)


def test_put_then_get_round_trips_and_exists(tmp_path: Path) -> None:
    store = LocalArtifacts(tmp_path)
    ref = run(store.put(FILES, name="adapter-v0"))
    assert run(store.exists(ref))
    assert run(store.get(ref)) == FILES
    assert ref.uri.startswith("file://")
    assert store.resolve("adapter-v0") == ref


def test_digest_depends_only_on_content_not_order_name_or_store(tmp_path: Path) -> None:
    """Equal content gives equal digests; any change of a path or a byte changes the digest."""
    a = run(LocalArtifacts(tmp_path / "a").put(FILES, name="x"))
    b = run(LocalArtifacts(tmp_path / "b").put(dict(reversed(FILES.items())), name="y"))
    assert a.digest == b.digest == compute_digest(FILES)
    assert a.uri != b.uri
    assert compute_digest({**FILES, "sub/notes.txt": b"hi!"}) != a.digest
    assert compute_digest({"sub/notes.TXT" if k == "sub/notes.txt" else k: v for k, v in FILES.items()}) != a.digest
    # Length-prefixing: moving a byte across a path/content boundary changes the digest.
    assert compute_digest({"ab": b"c"}) != compute_digest({"a": b"bc"})


def test_digest_is_stable_across_releases() -> None:
    """The digest encoding is a published format: a change here invalidates every stored ref."""
    assert compute_digest({}) == "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"

    expected = hashlib.sha256(b"a\0" + (1).to_bytes(8, "big") + b"x").hexdigest()
    assert compute_digest({"a": b"x"}) == "sha256:" + expected


def test_mutating_what_get_returned_does_not_change_the_store(tmp_path: Path) -> None:
    store = LocalArtifacts(tmp_path)
    ref = run(store.put(FILES, name="a"))
    got = run(store.get(ref))
    got["adapter_config.json"] = b"tampered"
    got["new"] = b"x"
    del got["sub/notes.txt"]
    assert run(store.get(ref)) == FILES


def test_mutating_the_input_after_put_does_not_change_the_store(tmp_path: Path) -> None:
    store = LocalArtifacts(tmp_path)
    buf = bytearray(b"abc")
    ref = run(store.put({"f": buf}, name="a"))
    buf[0] = ord("z")
    assert run(store.get(ref)) == {"f": b"abc"}


def test_put_is_idempotent_and_leaves_no_staging_behind(tmp_path: Path) -> None:
    store = LocalArtifacts(tmp_path)
    assert run(store.put(FILES, name="a")) == run(store.put(FILES, name="b"))
    assert list((tmp_path / "tmp").iterdir()) == []
    assert len(list((tmp_path / "objects").iterdir())) == 1


def test_empty_artifact_is_storable(tmp_path: Path) -> None:
    store = LocalArtifacts(tmp_path)
    ref = run(store.put({}, name="empty"))
    assert run(store.get(ref)) == {}


def test_missing_artifact_raises_not_found(tmp_path: Path) -> None:
    store = LocalArtifacts(tmp_path)
    ref = ArtifactRef(uri="file:///elsewhere", digest=compute_digest({"x": b"y"}))
    assert not run(store.exists(ref))
    with pytest.raises(ArtifactNotFoundError, match="put"):
        run(store.get(ref))
    with pytest.raises(ArtifactNotFoundError):
        store.resolve("never-stored")
    with pytest.raises(FileNotFoundError):  # what the in-memory store raises too
        run(store.get(ref))


@pytest.mark.parametrize("damage", ["edit", "truncate", "delete", "add"])
def test_corruption_on_disk_is_detected_and_put_repairs_it(tmp_path: Path, damage: str) -> None:
    store = LocalArtifacts(tmp_path)
    ref = run(store.put(FILES, name="a"))
    obj = tmp_path / "objects" / ref.digest.removeprefix("sha256:")
    target = obj / "adapter_model.safetensors"
    if damage == "edit":
        target.write_bytes(b"\x00\x01weightz")
    elif damage == "truncate":
        target.write_bytes(b"")
    elif damage == "delete":
        target.unlink()
    else:
        (obj / "extra").write_bytes(b"")
    with pytest.raises(ArtifactCorruptError, match="repair"):
        run(store.get(ref))
    with pytest.raises(ArtifactCorruptError):
        run(store.materialize(ref, tmp_path / "out"))
    assert run(store.put(FILES, name="a")) == ref
    assert run(store.get(ref)) == FILES


@pytest.mark.parametrize("bad", ["", "/abs", "../up", "a/../b", "a//b", "./a", "a\\b", "a/"])
def test_bad_paths_are_rejected(tmp_path: Path, bad: str) -> None:
    with pytest.raises(InvalidArtifactError, match="relative POSIX path"):
        run(LocalArtifacts(tmp_path).put({bad: b"x"}, name="a"))


def test_bad_content_names_and_digests_are_rejected(tmp_path: Path) -> None:
    store = LocalArtifacts(tmp_path)
    with pytest.raises(InvalidArtifactError, match="not bytes"):
        run(store.put({"f": "text"}, name="a"))  # type: ignore[dict-item]
    with pytest.raises(InvalidArtifactError, match="directory"):
        run(store.put({"a": b"", "a/b": b""}, name="a"))
    with pytest.raises(InvalidArtifactError, match="name"):
        run(store.put({}, name="../escape"))
    with pytest.raises(InvalidArtifactError, match="sha256"):
        run(store.get(ArtifactRef(uri="", digest="md5:abc")))


def test_put_dir_and_materialize_round_trip_a_real_directory(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    for rel, content in FILES.items():
        (src / rel).write_bytes(content)
    store = LocalArtifacts(tmp_path / "store")
    ref = run(store.put_dir(src, "adapter-v0"))
    assert ref == run(put_dir(store, src, "again"))
    out = run(store.materialize(ref, tmp_path / "out"))
    assert {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()} == FILES
    out2 = run(materialize(store, ref, tmp_path / "out2"))
    assert (out2 / "sub" / "notes.txt").read_bytes() == b"hi"


def test_put_dir_refuses_symlinks(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "link").symlink_to(tmp_path)
    with pytest.raises(InvalidArtifactError, match="symlink"):
        run(LocalArtifacts(tmp_path / "s").put_dir(src, "a"))
