"""Rollout buffers a fork might write, one correct and three broken; the buffer laws must fail each broken one on the
law it breaks and pass the correct one (so the laws are not about our volume-backed `VolumeBuffer`).

`MemoryBuffer` keeps each version as a dict `{iteration: JSON text of its rows}`; a version is its index.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from rl.conformance import Implementation
from rl.storage.volumes.buffer import ROLLOUT_FIELDS
from rl.types import Rollout


class MemoryBuffer:
    """A correct in-memory buffer."""

    def __init__(self) -> None:
        self.chain: list[dict[int, str]] = []

    def encode(self, rows: Sequence[Mapping[str, Any]]) -> str:
        for row in rows:
            self.check_reward(row["reward"])
        return json.dumps([dict(r) for r in rows], ensure_ascii=False)

    def check_reward(self, reward: float) -> None:
        if not math.isfinite(reward):
            raise ValueError(f"reward {reward!r} is not a finite number")

    def next_version(self, base: dict[int, str], iteration: int, text: str) -> dict[int, str]:
        return {**base, iteration: text}

    def append(self, iteration: int, rows: Sequence[Mapping[str, Any]], *, parent: int | None = None) -> int:
        index = parent if parent is not None else len(self.chain) - 1
        base = self.chain[index] if index >= 0 else {}
        text = self.encode(rows)
        if iteration in base:
            if base[iteration] == text:
                return index
            raise ValueError(f"iteration {iteration} is already stored with other rows")
        self.chain.append(self.next_version(base, iteration, text))
        return len(self.chain) - 1

    def read(self, version: int, iterations: Iterable[int] | None = None) -> list[dict[str, Any]]:
        held = self.chain[version]
        wanted = sorted(held) if iterations is None else sorted(set(iterations))
        missing = [it for it in wanted if it not in held]
        if missing:
            raise LookupError(f"version {version} has no iteration {missing}; it holds {sorted(held)}")
        return [row for it in wanted for row in json.loads(held[it])]

    def iterations(self, version: int) -> list[int]:
        return sorted(self.chain[version])

    def versions(self) -> list[int]:
        return list(range(len(self.chain)))

    def rescore(self, version: int, reward_fn: Callable[[Rollout], float]) -> int:
        rescored = {}
        for it in self.iterations(version):
            rows = self.read(version, [it])
            new = [
                {**r, "reward": float(reward_fn(Rollout.from_dict({k: r[k] for k in ROLLOUT_FIELDS})))} for r in rows
            ]
            rescored[it] = self.encode(new)
        self.chain.append(rescored)
        return len(self.chain) - 1


class InPlaceHeadBuffer(MemoryBuffer):
    """Adds each iteration to the head's own dict (no fork), so every version shares one table: a version read later
    holds every iteration appended since."""

    def next_version(self, base: dict[int, str], iteration: int, text: str) -> dict[int, str]:
        base[iteration] = text
        return base


class RoundedFloatBuffer(MemoryBuffer):
    """Writes floats with 12 significant digits (`%.12g`, a common "compact" float format): 1/3 comes back as
    0.333333333333."""

    def encode(self, rows: Sequence[Mapping[str, Any]]) -> str:
        super().encode(rows)
        return json.dumps([_rounded(dict(r)) for r in rows], ensure_ascii=False)


class NanOnlyRewardBuffer(MemoryBuffer):
    """Refuses a NaN reward but lets both infinities through (`reward != reward`, the usual NaN test), so a row with
    an infinite reward is stored and read back for training."""

    def check_reward(self, reward: float) -> None:
        if reward != reward:
            raise ValueError(f"reward {reward!r} is NaN")


def _rounded(value: Any) -> Any:
    if isinstance(value, float):
        return float(f"{value:.12g}")
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    return value


MEMORY_BUFFER = Implementation(name="memory-buffer", rollout_buffer=MemoryBuffer)
IN_PLACE_HEAD = Implementation(name="in-place-head", rollout_buffer=InPlaceHeadBuffer)
ROUNDED_FLOATS = Implementation(name="rounded-floats", rollout_buffer=RoundedFloatBuffer)
NAN_ONLY_REWARDS = Implementation(name="nan-only-rewards", rollout_buffer=NanOnlyRewardBuffer)
