"""What every contract shares: capability and seed fixtures, one event loop per test, the hypothesis settings."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, ClassVar, TypeVar

import pytest
from hypothesis import HealthCheck, example, settings

from rl.conformance.capabilities import Capabilities

T = TypeVar("T")

Run = Callable[[Awaitable[T]], T]
"""The `rl_run` fixture's type: run an awaitable to completion on the test's event loop and return its result."""


def law_settings(max_examples: int) -> settings:
    """Hypothesis settings of a law: deterministic (no database, no wall-clock deadline) and few examples.

    The implementation under test comes from a fixture and is reused across examples (the laws hold whatever state
    it is in), so the function-scoped-fixture health check is off; data is drawn inside the test, never via fixtures.
    A law stops at its first failure (an explicit example's is reported as it is, not shrunk or collected with others).
    """
    return settings(
        max_examples=max_examples,
        deadline=None,
        derandomize=True,
        database=None,
        report_multiple_bugs=False,
        suppress_health_check=[
            HealthCheck.function_scoped_fixture,
            HealthCheck.differing_executors,
            HealthCheck.too_slow,
        ],
    )


def explicit_examples(*cases: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Attach each case as an explicit hypothesis example of the law's `case` argument: the hazardous cells, run in
    order before anything is drawn (a failing one is reported as it is, never left to a chance draw)."""

    def decorate(law: Callable[..., Any]) -> Callable[..., Any]:
        for case in reversed(cases):
            law = example(case=case)(law)
        return law

    return decorate


def tier(name: str) -> Callable[[type[T]], type[T]]:
    """Mark every law defined in the decorated class (not inherited ones) with `rl_<name>`, so `-m rl_<name>` selects
    one tier even in the aggregate `LoopContract`."""
    mark = getattr(pytest.mark, f"rl_{name}")

    def decorate(cls: type[T]) -> type[T]:
        for attr, value in list(vars(cls).items()):
            if attr.startswith("test_") and callable(value):
                setattr(cls, attr, mark(value))
        return cls

    return decorate


class ContractBase:
    """Fixtures every contract has. Override `capabilities` to declare what your implementation lacks."""

    pytestmark: ClassVar[list[pytest.MarkDecorator]] = [pytest.mark.rl_conformance]

    @pytest.fixture
    def capabilities(self) -> Capabilities:
        """Return a `rl.conformance.Capabilities`; the default claims every capability."""
        return Capabilities()

    @pytest.fixture
    def rl_seed(self, request: pytest.FixtureRequest) -> int:
        """The run seed every law derives its seeds from: `--rl-seed` (default 0)."""
        return int(request.config.getoption("rl_seed", default=0) or 0)

    @pytest.fixture
    def rl_run(self) -> Iterator[Run[Any]]:
        """Run an awaitable on this test's event loop (one loop per test, closed afterwards); returns its result."""
        loop = asyncio.new_event_loop()

        def run(awaitable: Awaitable[T]) -> T:
            return loop.run_until_complete(_as_coroutine(awaitable))

        try:
            yield run
        finally:
            try:
                loop.run_until_complete(loop.shutdown_asyncgens())
            finally:
                loop.close()


async def _as_coroutine(awaitable: Awaitable[T]) -> T:
    return await awaitable


def must_provide(contract: str, fixture: str, what: str) -> NotImplementedError:
    """The error a required fixture raises until the implementer overrides it."""
    return NotImplementedError(
        f"{contract} needs the `{fixture}` fixture: override it in your test class to return {what}"
    )


def assert_same_step(
    reference: Any,
    other: Any,
    batch: Any,
    run: Run[Any],
    rel_tolerance: float,
    why: Callable[[str, float, float, str], str],
) -> None:
    """Run `batch`'s step on the `reference` and the `other` trainer and assert that the other's loss and pre-clip
    gradient norm equal the reference's within `rel_tolerance` relative; `why(what, got, expected, ratio)` is the
    failure's message, `ratio` already formatted."""
    expected = run(reference.train_step(batch)).metrics
    got = run(other.train_step(batch)).metrics
    for what, one, value in (("loss", expected.loss, got.loss), ("gradient norm", expected.grad_norm, got.grad_norm)):
        ratio = f"{value / one if one else float('nan'):.6g}"
        assert abs(value - one) <= rel_tolerance * max(abs(one), 1e-12), why(what, value, one, ratio)
