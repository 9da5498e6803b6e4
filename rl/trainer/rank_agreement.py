"""Failures agreed across the ranks of a process group, so one rank's error is every rank's error within a collective's
round trip instead of a hang until the collective timeout.

Each point where a rank's own work can fail (loading, its shard's forward-backwards, the optimizer step, rank 0's
save) is followed by one agreement every rank reaches, failed or not: `agree` all-reduces one failure flag per rank,
folded into an all-reduce the step makes anyway where there is one (the metrics' sums). When a flag is set, the ranks
exchange each failure's one-line summary (a second collective, on the failure path only) and every rank raises
`rl.errors.RankFailedError` naming the failed ranks and their errors. Why and where: docs/design.md#data-parallel-steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from rl.errors import RankFailedError, RlError, shown

__all__ = ["agree", "broadcast_outcome", "summary"]

SUMMARY_CHARS = 300


def summary(error: BaseException) -> str:
    """`Type: message` on one line, control characters escaped, cut to `SUMMARY_CHARS`."""
    return shown(f"{type(error).__name__}: {error}", SUMMARY_CHARS)


def agree(
    error: BaseException | None,
    device: torch.device | str,
    *,
    where: str,
    values: Sequence[float] = (),
    group: Any = None,
) -> list[float]:
    """The sums of `values` over the ranks of `group` (the default group when None), once no rank failed.

    Every rank calls it at the same point with its own `error` (None when its work succeeded): one all-reduce of
    `values` and one flag per rank. If any flag is set, every rank raises `RankFailedError` (a failed rank's own error
    as its `__cause__`); when every rank failed with the same `RlError` type (an input every rank checks alike, e.g. a
    stale batch), each raises its own error instead. If the collective itself fails (a peer died), `RankFailedError`
    says so. `device` must be where the backend reduces: the rank's CUDA device under NCCL.
    """
    world, me = dist.get_world_size(group), dist.get_rank(group)
    flags = [0.0] * world
    flags[me] = 0.0 if error is None else 1.0
    payload = torch.tensor([*values, *flags], dtype=torch.float64, device=device)  # [len(values) + world]
    try:
        dist.all_reduce(payload, group=group)
    except Exception as exc:  # a peer died or its connection dropped: gloo says so at once, NCCL at its timeout
        raise RankFailedError(me, world, where, collective_error=summary(exc)) from (error or exc)
    reduced = payload.tolist()
    failed = [r for r in range(world) if reduced[len(values) + r]]
    if not failed:
        return reduced[: len(values)]
    mine = None if error is None else (type(error).__qualname__, summary(error))
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, mine, group=group)  # the failure path only
    if isinstance(error, RlError) and all(g is not None and g[0] == type(error).__qualname__ for g in gathered):
        raise error  # every rank refused the same input alike: the input's own typed error, not a rank's
    failures = tuple((r, gathered[r][1] if gathered[r] else "an error it could not report") for r in failed)
    raise RankFailedError(me, world, where, failures) from error


def broadcast_outcome(result: Any, error: BaseException | None, *, where: str, src: int = 0, group: Any = None) -> Any:
    """Rank `src`'s `result` on every rank (one `broadcast_object_list`), or `RankFailedError` on every rank when
    `src` failed (its `error`; the other ranks' arguments are ignored)."""
    world, me = dist.get_world_size(group), dist.get_rank(group)
    message: list[Any] = [("ok", result) if error is None else ("error", summary(error))] if me == src else [None]
    try:
        dist.broadcast_object_list(message, src=src, group=group)
    except Exception as exc:
        raise RankFailedError(me, world, where, collective_error=summary(exc)) from (error or exc)
    status, payload = message[0]
    if status == "ok":
        return payload
    raise RankFailedError(me, world, where, ((src, payload),)) from error
