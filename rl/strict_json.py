"""Strict JSON for every file and `--json` line the project writes: never a `NaN` or `Infinity` token.

Python's `json` writes them by default, and strict parsers (JavaScript's `JSON.parse`, jq, Go, serde) reject the whole
document. Every writer passes `allow_nan=False` (a test scans rl/ and fakes/ for any that does not) and chooses, per
document, what a non-finite value becomes:

- `dumps`: refused, with a `NonFiniteMetricError` naming the field (manifests, configs: a NaN there is a bug).
- `flag_non_finite`: `null`, and the row's `non_finite` maps each such field (dotted path) to "nan", "inf" or "-inf"
  (`metrics.jsonl`, `--json` summaries: a diverged run's rows are still worth reading); `unflag_non_finite` restores.
- `tag_non_finite`: `{"__float__": "inf"}`, the form `rl.identity.canonical` gives it (the checkpoint, which must
  restore the exact value and whose digest is computed over that form anyway); `untag_non_finite` restores.
Pure (no torch or flyte import).
"""

from __future__ import annotations

import json
import math
from typing import Any

from rl.errors import NonFiniteMetricError

NON_FINITE_KEY = "non_finite"
_TAG = "__float__"


def dumps(obj: Any, **kwargs: Any) -> str:
    """`json.dumps(obj, allow_nan=False, **kwargs)`; a NaN or an infinity raises `NonFiniteMetricError` naming it."""
    try:
        return json.dumps(obj, allow_nan=False, **kwargs)
    except ValueError as exc:
        found = _non_finite_paths(obj, "")
        if not found:
            raise
        path, value = found[0]
        raise NonFiniteMetricError(
            f"{path or 'the value'} is {value!r}, which strict JSON cannot hold; nothing was written. Find where it "
            "became non-finite (a diverged loss, an overflowing sum), or flag it explicitly (rl.strict_json)"
        ) from exc


def flag_non_finite(row: dict[str, Any]) -> dict[str, Any]:
    """A copy of `row` with each non-finite float replaced by None, and `non_finite` naming them (absent if none)."""
    found = _non_finite_paths(row, "")
    if not found:
        return row
    out = _replace(row, lambda v: None)
    out[NON_FINITE_KEY] = {path: _spelling(value) for path, value in found}
    return out


def unflag_non_finite(row: dict[str, Any]) -> dict[str, Any]:
    """The inverse of `flag_non_finite`: the row with its flagged fields' values put back."""
    flags = row.get(NON_FINITE_KEY)
    if not isinstance(flags, dict):
        return row
    out = {k: v for k, v in row.items() if k != NON_FINITE_KEY}
    for path, spelling in flags.items():
        *parents, last = path.split(".")
        node: Any = out
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        node[int(last) if isinstance(node, list) else last] = float(spelling)
    return out


def tag_non_finite(obj: Any) -> Any:
    """`obj` with each non-finite float replaced by `{"__float__": "inf"}` (its `repr`)."""
    return _replace(obj, lambda v: {_TAG: repr(v)})


def untag_non_finite(obj: Any) -> Any:
    """The inverse of `tag_non_finite`."""
    if isinstance(obj, dict):
        if len(obj) == 1 and isinstance(obj.get(_TAG), str):
            return float(obj[_TAG])
        return {k: untag_non_finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [untag_non_finite(v) for v in obj]
    return obj


def _spelling(value: float) -> str:
    return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")


def _non_finite_paths(obj: Any, path: str) -> list[tuple[str, float]]:
    if isinstance(obj, float):
        return [] if math.isfinite(obj) else [(path, obj)]
    if isinstance(obj, dict):
        items: Any = obj.items()
    elif isinstance(obj, list | tuple):
        items = enumerate(obj)
    else:
        return []
    return [found for k, v in items for found in _non_finite_paths(v, f"{path}.{k}" if path else str(k))]


def _replace(obj: Any, replacement: Any) -> Any:
    if isinstance(obj, float) and not math.isfinite(obj):
        return replacement(obj)
    if isinstance(obj, dict):
        return {k: _replace(v, replacement) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_replace(v, replacement) for v in obj]
    return obj
