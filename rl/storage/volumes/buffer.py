"""The rollout buffer of the training-loop tutorial ("Keep rollouts on a volume"), on local copy-on-write volumes.

The buffer is a chain of versions of one volume: each `append` forks the previous version and adds `iter-NNNNN.jsonl`,
so a version stores only its own iteration's file and shares the rest with the version before it; any version stays
readable as it was. One rollout per line, with the fields of `rl.types.Rollout` plus `iteration` and `reward`
(`ROW_FIELDS`); read them with pandas through `dtype=PANDAS_DTYPES` and `precise_float=True` to keep text text and
floats exact (docs/volumes.md#the-rollout-buffer). `rescore` re-scores every stored rollout with another reward
function into a new version, generating nothing: the core of `rl rescore`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, TypeAdapter

from rl.errors import IterationExistsError, IterationNotFoundError, RowSchemaError, UntrustedValueError
from rl.metrics import finite_mean
from rl.storage.volumes.store import LocalVolumeStore, check_name
from rl.storage.volumes.version import LocalVolumeVersion
from rl.types import Rollout
from rl.untrusted import StrictModel, parse_json, validate

ROLLOUT_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(Rollout))
ROW_FIELDS: tuple[str, ...] = ("iteration", *ROLLOUT_FIELDS, "reward")
PANDAS_DTYPES: dict[str, str] = {"question": "str", "answer": "str", "completion": "str"}
_ITER_FILE = re.compile(r"iter-(\d{5,})\.jsonl")

RewardFn = Callable[[Rollout], float]
# What `json.dumps(row, allow_nan=False, ensure_ascii=False)` builds on every call, built once (the same bytes).
_ROW_ENCODER = json.JSONEncoder(allow_nan=False, ensure_ascii=False)
# An iteration's file: megabytes for the largest runs; a file past this is not one this tool wrote.
MAX_ITERATION_FILE_BYTES = 256 << 20

_Int64 = Annotated[int, Field(ge=-(2**63), le=2**63 - 1)]
_Count = Annotated[int, Field(ge=0, le=2**63 - 1)]
_Text = Annotated[str, Field(max_length=1 << 20)]
_Finite = Annotated[float, Field(allow_inf_nan=False)]


class _RowModel(StrictModel):
    """One stored row, as `rollout_rows` writes it: checked field by field when read back, since a buffer may come in
    a run directory someone sent (strict: no "1" for 1, no True for a number, no NaN reward)."""

    iteration: _Count
    group_id: _Count
    question: _Text
    answer: _Text
    completion: _Text
    prompt_token_ids: Annotated[list[_Count], Field(max_length=1 << 20)]
    token_ids: Annotated[list[_Count], Field(max_length=1 << 20)]
    logprobs: Annotated[list[_Finite], Field(max_length=1 << 20)]
    policy_version: _Int64
    seed: _Int64
    reward: _Finite


_ROW = TypeAdapter(_RowModel)


@dataclass(frozen=True)
class RescoreStats:
    """What `rescore` did: `generated` is always 0, because re-scoring samples nothing."""

    source_version: str
    buffer_version: str
    reward: str
    iterations: list[int]
    rollouts_rescored: int
    changed: int
    mean_reward_before: float
    mean_reward_after: float
    generated: int = 0

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def iteration_file(iteration: int) -> str:
    """The file that holds one iteration's rollouts: `iter-00012.jsonl`."""
    if iteration < 0:
        raise ValueError(f"iteration must be >= 0, not {iteration}")
    return f"iter-{iteration:05d}.jsonl"


def rollout_rows(iteration: int, rollouts: Sequence[Rollout], rewards: Sequence[float]) -> list[dict[str, Any]]:
    """The buffer's rows for one iteration: each rollout's fields plus `iteration` and its reward."""
    if len(rollouts) != len(rewards):
        raise RowSchemaError(f"iteration {iteration}: {len(rollouts)} rollouts but {len(rewards)} rewards")
    return [{"iteration": iteration, **r.to_dict(), "reward": float(w)} for r, w in zip(rollouts, rewards, strict=True)]


class VolumeBuffer:
    """Rollouts on a chain of versions of the volume `name` in `store`; each version adds one iteration's file."""

    def __init__(self, store: LocalVolumeStore, name: str) -> None:
        check_name(name)
        self.store = store
        self.name = name

    def __repr__(self) -> str:
        return f"VolumeBuffer({self.store!r}, {self.name!r})"

    def head(self) -> LocalVolumeVersion | None:
        """The latest version, or None before the first append."""
        versions = self.versions()
        return versions[-1] if versions else None

    def versions(self) -> list[LocalVolumeVersion]:
        """Every version of the buffer, oldest first."""
        return self.store.versions(self.name)

    def append(
        self, iteration: int, rows: Sequence[Mapping[str, Any]], *, parent: LocalVolumeVersion | None = None
    ) -> LocalVolumeVersion:
        """Fork `parent` (default: the head), add `iter-NNNNN.jsonl`, finalize; returns the new version.

        Re-appending rows the parent already holds for `iteration` (a retried task) returns the parent unchanged;
        different rows for a stored iteration raise IterationExistsError.
        """
        payload = encode_rows(iteration, rows)
        relpath = iteration_file(iteration)
        base = parent if parent is not None else self.head()
        if base is not None and relpath in base.files:
            if base.files[relpath].sha256 == hashlib.sha256(payload).hexdigest():
                return base
            raise IterationExistsError(
                f"buffer {self.name!r} version {base.version[:12]} already holds iteration {iteration} with different "
                f"rows; append a new iteration, or fork an earlier version (parent=...) to rewrite history"
            )
        with base.fork(self.name) if base is not None else self.store.new(self.name) as rw:
            rw.write_bytes(relpath, payload)
            return rw.finalize(f"iteration {iteration}")

    def iterations(self, version: LocalVolumeVersion | str) -> list[int]:
        """The iterations a version holds, ascending."""
        return sorted(self._iteration_files(self._resolve(version)))

    def path(self, version: LocalVolumeVersion | str, iteration: int) -> Path:
        """The JSONL file of one iteration in one version (for `pandas.read_json(path, lines=True)`)."""
        v = self._resolve(version)
        self._require(v, [iteration])
        return v.file(iteration_file(iteration))

    def read(self, version: LocalVolumeVersion | str, iterations: Iterable[int] | None = None) -> list[dict[str, Any]]:
        """The rows of the requested iterations (default: all), by iteration; opens no other iteration's file."""
        v = self._resolve(version)
        files = self._iteration_files(v)
        wanted = sorted(files) if iterations is None else sorted(set(iterations))
        self._require(v, wanted)
        rows: list[dict[str, Any]] = []
        for it in wanted:
            rows.extend(_read_rows(v, files[it], it))
        return rows

    def rescore(
        self,
        version: LocalVolumeVersion | str,
        reward_fn: RewardFn,
        *,
        reward_name: str | None = None,
        name: str | None = None,
    ) -> tuple[LocalVolumeVersion, RescoreStats]:
        """Re-score every stored rollout of `version` with `reward_fn` into a new version (forked from it, named `name`,
        default this buffer's); completions, log-probs and every other field are kept and nothing is generated.
        """
        source = self._resolve(version)
        label = reward_name or str(getattr(reward_fn, "__name__", type(reward_fn).__name__))
        files = self._iteration_files(source)
        before: list[float] = []
        after: list[float] = []
        with source.fork(name or self.name) as rw:
            for it in sorted(files):
                rescored = []
                for row in _read_rows(source, files[it], it):
                    rollout = Rollout.from_dict({k: row[k] for k in ROLLOUT_FIELDS})
                    reward = reward_fn(rollout)
                    if isinstance(reward, bool) or not isinstance(reward, int | float) or not math.isfinite(reward):
                        raise RowSchemaError(
                            f"{label} returned {reward!r} for a rollout of iteration {it}, group {rollout.group_id}; "
                            f"a reward function must return a finite number"
                        )
                    reward = float(reward)
                    before.append(float(row["reward"]))
                    after.append(reward)
                    rescored.append({**row, "reward": reward})
                rw.write_bytes(files[it], encode_rows(it, rescored))
            new = rw.finalize(f"rescore {source.version[:12]} with {label}")
        stats = RescoreStats(
            source_version=source.version,
            buffer_version=new.version,
            reward=label,
            iterations=sorted(files),
            rollouts_rescored=len(after),
            changed=sum(a != b for a, b in zip(before, after, strict=True)),
            mean_reward_before=_mean(before),
            mean_reward_after=_mean(after),
        )
        return new, stats

    def _resolve(self, version: LocalVolumeVersion | str) -> LocalVolumeVersion:
        return version if isinstance(version, LocalVolumeVersion) else self.store.open(version)

    @staticmethod
    def _iteration_files(version: LocalVolumeVersion) -> dict[int, str]:
        # From the manifest, so listing iterations touches no data file.
        return {int(m.group(1)): rel for rel in version.files if (m := _ITER_FILE.fullmatch(rel))}

    def _require(self, version: LocalVolumeVersion, iterations: Iterable[int]) -> None:
        held = self._iteration_files(version)
        missing = [it for it in iterations if it not in held]
        if missing:
            raise IterationNotFoundError(
                f"buffer version {version.version[:12]} ({version.name!r}) has no iteration {missing}; "
                f"it holds {sorted(held) or 'none'}"
            )


def encode_rows(iteration: int, rows: Sequence[Mapping[str, Any]]) -> bytes:
    """One iteration's JSONL, after checking every row has `ROW_FIELDS`, this iteration and a finite reward."""
    lines = []
    for i, row in enumerate(rows):
        missing = [f for f in ROW_FIELDS if f not in row]
        if missing:
            raise RowSchemaError(
                f"row {i} of iteration {iteration} lacks {missing}; a row is a Rollout's fields plus iteration and "
                f"reward (build rows with rollout_rows)"
            )
        if row["iteration"] != iteration:
            raise RowSchemaError(f"row {i} says iteration {row['iteration']}, but it is being appended as {iteration}")
        reward = row["reward"]
        if isinstance(reward, bool) or not isinstance(reward, int | float) or not math.isfinite(reward):
            raise RowSchemaError(f"row {i} of iteration {iteration} has reward {reward!r}; rewards are finite numbers")
        try:
            lines.append(_ROW_ENCODER.encode(dict(row)))
        except (TypeError, ValueError) as exc:
            raise RowSchemaError(f"row {i} of iteration {iteration} is not plain finite JSON: {exc}") from exc
    return "".join(f"{line}\n" for line in lines).encode()


def _read_rows(version: LocalVolumeVersion, relpath: str, iteration: int) -> list[dict[str, Any]]:
    """The rows of one iteration's file, each parsed (strict JSON, bounded) and checked against the row schema before
    anything uses it; `RowSchemaError` naming the file, line and field otherwise."""
    where = f"{relpath} of buffer version {version.version[:12]} ({version.store.root})"
    path = version.file(relpath)
    try:
        data = version.store.fs.read_bytes(path, limit=MAX_ITERATION_FILE_BYTES)
    except OverflowError:
        raise RowSchemaError(f"{where} is larger than {MAX_ITERATION_FILE_BYTES} bytes; {_NOT_OURS}") from None
    if not data.endswith(b"\n") and data:
        raise RowSchemaError(f"{where} does not end with a newline (a torn write?); {_NOT_OURS}")
    rows = []
    for n, line in enumerate(data.split(b"\n")[:-1], start=1):
        try:
            row = parse_json(line)
            if not isinstance(row, dict):
                raise UntrustedValueError(f"it is a JSON {type(row).__name__}, not an object")
            validate(_ROW, row)
        except UntrustedValueError as exc:
            raise RowSchemaError(f"{where}, line {n}: {exc}; {_NOT_OURS}") from None
        if row["iteration"] != iteration:
            raise RowSchemaError(
                f"{where}, line {n}: field iteration is {row['iteration']}, not {iteration}; {_NOT_OURS}"
            )
        rows.append(row)
    return rows


_NOT_OURS = (
    "this buffer was not written by this tool as it stands. Restore the run directory from its source, or re-run "
    "the iterations it holds"
)


def _mean(xs: Sequence[float]) -> float:
    return finite_mean(xs)
