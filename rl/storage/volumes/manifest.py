"""What a version's manifest holds (`new_manifest`, `FileEntry`) and may say: the checks a manifest read from disk
passes before any of it is used.

A run directory can come from someone else (a colleague's tarball, a downloaded artifact), so its manifests are input,
not trusted state. Forking a version creates every directory and symlink its manifest names and links every file, so an
entry such as "/home/you/.ssh" or "../../x", a symlink to "/etc", or a file listed under a directory that is really a
symlink would make a fork write outside its volume. Every entry therefore passes the rules a write through a writable
volume passes (a relative path without '..'), in canonical form, under directories the manifest itself lists, and a
symlink's target must stay inside the volume. The version id is recomputed from the manifest, so a manifest edited after
it was finalized (or forged) is refused too.

Pure functions returning a description of the first problem (or None), so the store raises its own error type.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

MANIFEST_FORMAT = 1
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")
VERSION_RE = re.compile(r"[0-9a-f]{64}")


def digest(obj: Any) -> str:
    """sha256 of canonical JSON: the content digest and the version id are this over their parts."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()).hexdigest()


@dataclass(frozen=True)
class FileEntry:
    """One file of a finalized version, as its manifest records it."""

    sha256: str
    size: int
    executable: bool


def new_manifest(
    name: str,
    parent: str | None,
    message: str,
    tree: dict[str, Any],
    *,
    published_at_ns: int,
    mtimes_ns: Mapping[str, int],
) -> dict[str, Any]:
    """The manifest `finalize` writes for a file tree (`files`, `dirs`, `symlinks`): its version id is the digest of
    (format, name, parent, message, content digest), so finalizing the same content twice gives the same version."""
    identity = {
        "format": MANIFEST_FORMAT,
        "name": name,
        "parent": parent,
        "message": message,
        "content_digest": digest(tree),
    }
    return {**identity, "version": digest(identity), **tree, "published_at_ns": published_at_ns, "mtimes_ns": mtimes_ns}


def relpath_problem(rel: object) -> str | None:
    """Why `rel` cannot name an entry of a volume: what a write refuses, plus non-canonical spellings ("a//b")."""
    if not isinstance(rel, str) or not rel:
        return f"entry {rel!r} is not a non-empty path"
    if "\0" in rel:
        return f"entry {rel!r} holds a NUL byte"
    path = PurePosixPath(rel)
    if path.is_absolute() or ".." in path.parts or path == PurePosixPath("."):
        return f"entry {rel!r} is not a relative path inside the volume (absolute, or it has '..')"
    if path.as_posix() != rel:
        return f"entry {rel!r} is not in canonical form ({path.as_posix()!r})"
    return None


def symlink_target_problem(rel: str, target: object) -> str | None:
    """Why the symlink `rel` -> `target` could lead outside its volume, or None.

    Allowed: a relative target made of leading '..' steps, no more than the link's own depth, then downward names.
    A '..' after a downward name is refused even when it looks harmless ("sub/.."): the name may itself be a symlink,
    and the kernel resolves '..' from where that symlink leads, not lexically.
    """
    if not isinstance(target, str) or not target or "\0" in target:
        return f"symlink {rel!r} has target {target!r}, which is not a non-empty path"
    path = PurePosixPath(target)
    if path.is_absolute():
        return f"symlink {rel!r} points at the absolute path {target!r}, outside the volume"
    parts = [p for p in path.parts if p != "."]
    ups = 0
    while ups < len(parts) and parts[ups] == "..":
        ups += 1
    if ".." in parts[ups:]:
        return f"symlink {rel!r} -> {target!r} has '..' after a name; spell the target without it"
    if ups > len(PurePosixPath(rel).parts) - 1:
        return f"symlink {rel!r} -> {target!r} climbs above the volume's root"
    return None


def manifest_problem(manifest: object, version: str) -> str | None:
    """The first reason the manifest read for `version` cannot be used; None when its entries and id check out."""
    if not isinstance(manifest, dict):
        return "the manifest is not a JSON object"
    if manifest.get("format") != MANIFEST_FORMAT:
        return f"format {manifest.get('format')!r} is not {MANIFEST_FORMAT}"
    if manifest.get("version") != version:
        return f"it names version {manifest.get('version')!r}"
    name, parent = manifest.get("name"), manifest.get("parent")
    if not isinstance(name, str) or not NAME_RE.fullmatch(name) or VERSION_RE.fullmatch(name):
        return f"volume name {name!r} is invalid"
    if parent is not None and not (isinstance(parent, str) and VERSION_RE.fullmatch(parent)):
        return f"parent {parent!r} is not a version id"
    if not isinstance(manifest.get("message"), str):
        return "its message is not a string"
    files, dirs, symlinks = manifest.get("files"), manifest.get("dirs"), manifest.get("symlinks")
    mtimes, published = manifest.get("mtimes_ns"), manifest.get("published_at_ns")
    if not (isinstance(files, dict) and isinstance(dirs, list) and isinstance(symlinks, dict)):
        return "files, dirs and symlinks are not an object, a list and an object"
    if not isinstance(mtimes, dict) or set(mtimes) != set(files) or not all(_is_int(t) for t in mtimes.values()):
        return "mtimes_ns does not give an integer for exactly the manifest's files"
    if not _is_int(published):
        return "published_at_ns is not an integer"
    problem = _tree_problem(files, dirs, symlinks)
    if problem:
        return problem
    tree = {"files": files, "dirs": dirs, "symlinks": symlinks}
    identity = {"format": MANIFEST_FORMAT, "name": name, "parent": parent, "message": manifest["message"]}
    if manifest.get("content_digest") != digest(tree):
        return "its content_digest does not match its files, dirs and symlinks (the manifest was edited)"
    if digest({**identity, "content_digest": digest(tree)}) != version:
        return "its contents do not hash to its version id (the manifest was edited, or is not this version's)"
    return None


def _tree_problem(files: Mapping[str, Any], dirs: list[Any], symlinks: Mapping[str, Any]) -> str | None:
    kinds: dict[str, str] = {}
    for kind, entries in (("dir", dirs), ("file", list(files)), ("symlink", list(symlinks))):
        for rel in entries:
            problem = relpath_problem(rel)
            if problem:
                return problem
            if rel in kinds:
                return f"entry {rel!r} is listed both as a {kinds[rel]} and as a {kind}"
            kinds[rel] = kind
    for rel, kind in kinds.items():
        # Every ancestor must be a directory the manifest lists, so creating an entry never goes through a symlink.
        for ancestor in list(PurePosixPath(rel).parents)[:-1]:
            if kinds.get(ancestor.as_posix()) != "dir":
                return f"{kind} {rel!r} lies under {ancestor.as_posix()!r}, which is not a directory of the manifest"
    for rel, entry in files.items():
        if not (
            isinstance(entry, dict)
            and set(entry) == {"sha256", "size", "executable"}
            and isinstance(entry["sha256"], str)
            and VERSION_RE.fullmatch(entry["sha256"])
            and _is_int(entry["size"])
            and entry["size"] >= 0
            and isinstance(entry["executable"], bool)
        ):
            return f"file {rel!r} has the malformed entry {entry!r}"
    for rel, target in symlinks.items():
        problem = symlink_target_problem(rel, target)
        if problem:
            return problem
    return None


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
