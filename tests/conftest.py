"""Hypothesis profiles, chosen by HYPOTHESIS_PROFILE: `dev` (the default), `ci` (more examples) and `unit` (what a bare
`nox -s unit` runs; CI names `dev` or `ci` for every session, docs/benchmarks.md)."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from hypothesis import HealthCheck, settings

settings.register_profile("dev", max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("ci", max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# Only properties that name no count of their own; a law's own `max_examples` is kept.
settings.register_profile("unit", max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


# -- No task exception left unread ------------------------------------------------------------------------------------
# An asyncio task whose exception nobody reads is reported by the garbage collector whenever it runs; on CPython 3.11.7
# that report, landing during pytest's parsing of a later module, crashed the run (gh-106905). So each test that made
# an event loop collects its garbage at teardown and fails if a task exception went unread, naming the task.

import asyncio  # noqa: E402
import gc  # noqa: E402
import logging  # noqa: E402

import pytest  # noqa: E402

_LOOPS_MADE = [0]
_real_loop_init = asyncio.BaseEventLoop.__init__


def _counting_loop_init(self: asyncio.BaseEventLoop, *args: object, **kwargs: object) -> None:
    _LOOPS_MADE[0] += 1
    _real_loop_init(self, *args, **kwargs)  # type: ignore[arg-type]


asyncio.BaseEventLoop.__init__ = _counting_loop_init  # type: ignore[method-assign]


class _UnreadTaskExceptions(logging.Handler):
    """Collects asyncio's "exception was never retrieved" reports (the default exception handler logs them)."""

    def __init__(self) -> None:
        super().__init__(level=logging.ERROR)
        self.found: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "never retrieved" in message:
            self.found.append(message.splitlines()[0] + (f": {record.exc_info[1]!r}" if record.exc_info else ""))


_UNREAD = _UnreadTaskExceptions()
logging.getLogger("asyncio").addHandler(_UNREAD)


@pytest.hookimpl(wrapper=True)
def pytest_collection(session: pytest.Session) -> object:
    """No automatic garbage collection while collecting: importing torch, transformers and every test module makes
    little garbage, but the collector walked the growing heap again and again (~8 % of collection's CPU time, 6.9 ->
    6.3 s). `pytest_collection_finish` (below) collects once, at the end."""
    gc.disable()
    try:
        return (yield)
    finally:
        gc.enable()


def pytest_collection_finish(session: pytest.Session) -> None:
    """Freezes what collection built (torch, transformers, every test module) out of the garbage collector.

    Each test that made an event loop collects garbage at teardown (below), and several laws collect after dropping a
    writer; a full collection walked every object the worker holds, most of them modules that live as long as it does.
    Frozen objects are never collected but stay alive anyway; everything a test creates is collected as before.
    """
    gc.collect()
    gc.freeze()


@pytest.fixture(autouse=True)
def no_unread_task_exception() -> object:
    """Fails the test that left an asyncio task (or future) exception nobody retrieved."""
    made = _LOOPS_MADE[0]
    _UNREAD.found.clear()
    yield
    if _LOOPS_MADE[0] != made:
        gc.collect()  # a task dropped with its exception unread reports it only when it is collected
        # What survived a full collection is alive: frozen, so later collections walk only what later tests make (a
        # full walk of everything the worker held was 11 % of the suite's test time; docs/benchmarks.md).
        gc.freeze()
    if _UNREAD.found:
        found, _UNREAD.found[:] = list(_UNREAD.found), []
        pytest.fail(f"the test left {len(found)} asyncio task exception(s) unread: {'; '.join(found)[:2000]}")
