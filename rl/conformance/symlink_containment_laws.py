"""The volume law on symlinks, mixed into `VolumeStoreContract`: no symlink of a published version, or of a fork of
it, leads outside the volume, at any depth.

A version is read by later tasks and forked by later writers, so a symlink whose target climbs above the volume's root
(`../../x` two directories down is fine, three is not) is a read or a write outside it. The law draws where a writer
puts a link (its directory's depth) and what it points at (how many `..`, then names, possibly through another link),
writes it through `mount()`, and checks the store either refuses the finalize (a `ValueError`, or an `OSError` from a
store that copies and so follows the links) or publishes a version (and forks) whose every link the kernel resolves
inside. A store may refuse every symlink; it may never
publish one that leaves.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from rl.conformance.support.contract_base import explicit_examples, law_settings, tier
from rl.protocols import VolumeStore

__all__ = ["SymlinkContainmentLaws", "links_leaving"]

DIRS = ("d1", "d1/d2", "d1/d2/d3")
"""The directories a drawn layout has: a link sits at depth 0 to 3."""

Link = tuple[int, int, str]
"""(depth of the link's directory, leading `..` steps, what follows them)."""

LINKS = st.tuples(st.integers(0, 3), st.integers(0, 5), st.sampled_from(["x", "d1", "d1/l0", "", "d1/d2/x"]))
LAYOUTS = st.lists(LINKS, min_size=1, max_size=3)

HAZARDS: tuple[list[Link], ...] = (
    [(1, 2, "x")],  # one '..' more than the link's depth: the off-by-one
    [(0, 1, "x")],  # a link at the root climbing out
    [(3, 4, "")],  # the deepest link climbing exactly one above the root
    [(1, 1, ""), (1, 0, "l0/../x")],  # a second link going through the first (d1/l0 -> the root), then up
    [(3, 3, "x"), (2, 2, "d1/d2/d3/l0")],  # in bounds, chained: must not be refused for being deep
)
"""The cells where a depth check breaks, run first."""


def _target(ups: int, tail: str) -> str:
    return "/".join([*([".."] * ups), *([tail] if tail else [])]) or "."


def links_leaving(root: Path) -> list[str]:
    """Each symlink under `root` (not followed) that the kernel resolves outside `root`, as 'rel -> target (lands)'."""
    top = os.path.realpath(root)
    leaving = []
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [*dirnames, *filenames]:
            path = os.path.join(dirpath, name)
            if not os.path.islink(path):
                continue
            lands = os.path.realpath(path)
            if lands != top and not lands.startswith(top + os.sep):
                leaving.append(f"{os.path.relpath(path, root)} -> {os.readlink(path)} (lands at {lands})")
    return leaving


@tier("volumes")
class SymlinkContainmentLaws:
    """Needs `volume_store_factory` (`VolumeStoreContract`'s fixture)."""

    @law_settings(max_examples=20)
    @given(case=LAYOUTS)
    @explicit_examples(*HAZARDS)
    def test_volumes_no_symlink_target_leaves_the_volume_at_any_depth(
        self, volume_store_factory: Callable[[], VolumeStore], case: list[Link]
    ) -> None:
        """Symlinks drawn at depths 0 to 3, climbing 0 to 5 levels then naming a file, a directory or another link,
        are either refused at finalize (a `ValueError` or `OSError`) or published, and forked, resolving inside."""
        store = volume_store_factory()
        rw = store.new(f"law-links-{uuid.uuid4().hex[:8]}")
        mount = Path(rw.mount())
        for d in DIRS:
            (mount / d).mkdir(parents=True, exist_ok=True)
        (mount / "x").write_bytes(b"x")
        made = []
        for i, (depth, ups, tail) in enumerate(case):
            rel = "/".join([*DIRS[depth - 1].split("/"), f"l{i}"]) if depth else f"l{i}"
            os.symlink(_target(ups, tail), mount / rel)
            made.append(f"{rel} -> {_target(ups, tail)}")
        try:
            version = rw.finalize("links")
        except (ValueError, OSError):
            return
        leaving = links_leaving(version.path())
        assert not leaving, (
            f"the store published symlinks {made} and these lead outside the version: {leaving}. Refuse a link whose "
            "target climbs above the volume's root (count its '..' against the link's own depth), at finalize"
        )
        fork: Any = version.fork(f"law-links-fork-{uuid.uuid4().hex[:8]}")
        leaving = links_leaving(Path(fork.mount()))
        assert not leaving, f"a fork of a version with symlinks {made} has links leading outside it: {leaving}"
