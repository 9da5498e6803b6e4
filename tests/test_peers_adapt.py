"""The shape glue the peer adapters share (`peers/_adapt.py`); the adapters themselves run in `nox -s peers`."""

from __future__ import annotations

import importlib.util
from pathlib import Path

# peers/ is not installed (it is not in the wheel): load its one library-free module from the checkout.
_SPEC = importlib.util.spec_from_file_location(
    "peers_adapt", Path(__file__).resolve().parents[1] / "peers" / "_adapt.py"
)
assert _SPEC is not None and _SPEC.loader is not None
_adapt = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(_adapt)
groups_by_size = _adapt.groups_by_size


def test_groups_by_size_buckets_interleaved_groups_in_order_of_first_appearance():
    """Every sample lands in exactly one group, groups keep input order within them, buckets are keyed by size."""
    assert groups_by_size([0, 5, 0, 7, -3, -3, -3]) == {2: [[0, 2]], 1: [[1], [3]], 3: [[4, 5, 6]]}
    assert groups_by_size([]) == {}
