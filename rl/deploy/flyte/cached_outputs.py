"""Calling a cached task whose result names files: a cache hit is only as good as the files it names.

Flyte's cache stores a task's result, and a `Dir` result only names where its files are. When those files are
deleted and the cache entry is not, every later run reuses a result that names nothing. Local mode does this after
every reboot: it writes files under `/tmp/flyte/raw_data` and keeps its cache in `~/.flyte/local-cache`, so the next
`flyte run --local` failed in its driver ("model directory ... does not exist") and would have trained from adapters
that were gone. On a cluster, a lifecycle rule on the raw-data bucket does the same.

`call_cached` checks each named path after the call; if one is gone it calls the task again under a cache salt
derived from the missing path, which runs it afresh the first time and reuses that fresh result after.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import flyte
from flyte.io import Dir

from rl.errors import ArtifactNotFoundError

__all__ = ["call_cached", "missing_paths"]

R = TypeVar("R")


async def missing_paths(paths: Iterable[str]) -> list[str]:
    """The paths among `paths` (Dir locations, local or remote) that do not exist."""
    return [path for path in paths if not await Dir.from_existing_remote(path).exists()]


async def call_cached(task: Any, *args: Any, names: Callable[[R], Iterable[str]]) -> R:
    """`await task(*args)`, called again past the cache entry while the result's `names(result)` paths are gone.

    Each stale entry is stepped past with a cache salt naming its missing path, so a rerun's result is cached too and
    the next run reuses it after the same check; when a later wipe removes that one as well, the next salt steps past
    it. Raises `ArtifactNotFoundError` when a result that did not come from the cache (an uncached task's, or one run
    with the cache off after `MAX_STALE` stale entries) names a path that does not exist: a task that returned a
    location it never wrote."""
    attempt = task
    for _ in range(MAX_STALE):
        result: R = await attempt(*args)
        missing = await missing_paths(names(result))
        if not missing:
            return result
        if attempt.cache.behavior == "disable":  # not a stale cache hit: the task returned a path it never wrote
            raise ArtifactNotFoundError(f"{task.name} returned {missing[0]}, which does not exist")
        flyte.logger.warning(
            f"{task.name}: a cached result names {missing[0]}, which no longer exists (its files were deleted but not "
            "the cache entry; local mode keeps files under /tmp and the cache under ~/.flyte); looking past that entry"
        )
        attempt = task.override(cache=flyte.Cache(behavior="auto", salt=f"{attempt.cache.salt} past {missing[0]}"))
    return await call_cached(task.override(cache="disable"), *args, names=names)


MAX_STALE = 8
"""Stale cache entries stepped past, one per wipe since the task's inputs were first cached, before running the task
with its cache off."""
