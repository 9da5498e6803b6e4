"""Our volumes' symlink rule (`rl.storage.volumes.manifest.symlink_target_problem`) against the kernel: a target it
accepts resolves inside the volume, and one it refuses for climbing resolves outside, at every depth."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from hypothesis import example, given, settings
from hypothesis import strategies as st

from rl.storage.volumes.manifest import symlink_target_problem

NAMES = st.sampled_from(["a", "b", "x"])


def _lands_inside(root: Path, rel: str, target: str) -> bool:
    link = root / rel
    link.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(target, link)
    top = os.path.realpath(root)
    lands = os.path.realpath(link)
    return lands == top or lands.startswith(top + os.sep)


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(
    dirs=st.lists(NAMES, max_size=3),
    ups=st.integers(0, 5),
    tail=st.lists(NAMES, max_size=2),
)
@example(dirs=["a"], ups=2, tail=["x"])  # one '..' more than the link's depth
@example(dirs=[], ups=1, tail=[])
@example(dirs=["a", "b", "x"], ups=3, tail=["x"])  # exactly to the root, from the deepest link: allowed
def test_an_accepted_symlink_lands_inside_and_a_refused_climb_lands_outside(dirs, ups, tail):
    """For a link `dirs/l` -> `'..' * ups / tail`, the rule accepts exactly the targets the kernel resolves inside."""
    rel = "/".join([*dirs, "l"])
    target = "/".join([".."] * ups + tail) or "."
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "volume" / "data"  # the volume's root sits below other directories, as a version's does
        root.mkdir(parents=True)
        inside = _lands_inside(root, rel, target)
    problem = symlink_target_problem(rel, target)
    assert (problem is None) == inside, (
        f"{rel} -> {target}: the rule says {problem!r}, the kernel lands inside={inside}"
    )
