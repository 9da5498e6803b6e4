"""The suite's guard against unread asyncio task exceptions (tests/conftest.py): a task dropped with its exception
unread is reported at the test's teardown, not by the garbage collector at a random later moment (gh-106905)."""

from __future__ import annotations

import asyncio
import gc

from conftest import _UNREAD


def test_a_dropped_task_with_an_unread_exception_is_caught_at_teardown():
    """The guard's own law: after gc, the dropped task's exception is in its record (cleared here so this test
    passes; any other test leaving one fails)."""

    async def boom() -> None:
        raise ValueError("nobody reads this")

    async def main() -> None:
        asyncio.get_running_loop().create_task(boom())
        await asyncio.sleep(0)
        await asyncio.sleep(0)

    asyncio.run(main())
    gc.collect()
    found, _UNREAD.found[:] = list(_UNREAD.found), []
    assert any("never retrieved" in f and "nobody reads this" in f for f in found), found
