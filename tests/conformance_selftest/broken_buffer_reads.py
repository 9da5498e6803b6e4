"""Rollout buffers whose `read` trusts their storage, for the read law's self-test
(tests/conformance_selftest/test_broken_buffer_reads.py), beside one that checks what it reads.

Each is broken_buffers' `MemoryBuffer` (a version is a dict `{iteration: JSON text of its rows}`), with
`plant_memory_rows` writing rows past `append`'s checks (Python's JSON writes an infinity as `Infinity` and reads it
back as one).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from broken_buffers import MemoryBuffer

from rl.conformance import Implementation


def plant_memory_rows(buffer: MemoryBuffer, iteration: int, rows: Sequence[Mapping[str, Any]]) -> int:
    """`rows` stored as `iteration` in a child of the latest version, unchecked."""
    head = buffer.chain[-1] if buffer.chain else {}
    buffer.chain.append({**head, iteration: json.dumps([dict(r) for r in rows])})
    return len(buffer.chain) - 1


class CheckedReadBuffer(MemoryBuffer):
    """Checks every reward it reads as `append` checks every reward it stores: correct."""

    def read(self, version: int, iterations: Iterable[int] | None = None) -> list[dict[str, Any]]:
        rows = super().read(version, iterations)
        for i, row in enumerate(rows):
            if not math.isfinite(row["reward"]):
                raise ValueError(f"stored row {i} of version {version} has reward {row['reward']!r}")
        return rows


class NanOnlyReadBuffer(MemoryBuffer):
    """Checks what it reads for NaN only (`reward != reward`): a stored infinity is read back for training."""

    def read(self, version: int, iterations: Iterable[int] | None = None) -> list[dict[str, Any]]:
        rows = super().read(version, iterations)
        if any(row["reward"] != row["reward"] for row in rows):
            raise ValueError(f"a stored row of version {version} has a NaN reward")
        return rows


CHECKED_READS = Implementation(
    name="checked-reads", rollout_buffer=CheckedReadBuffer, plant_rollout_rows=plant_memory_rows
)
TRUSTED_READS = Implementation(name="trusted-reads", rollout_buffer=MemoryBuffer, plant_rollout_rows=plant_memory_rows)
NAN_ONLY_READS = Implementation(
    name="nan-only-reads", rollout_buffer=NanOnlyReadBuffer, plant_rollout_rows=plant_memory_rows
)
