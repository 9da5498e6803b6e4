"""What `--rl-impl module:attr` names: an `Implementation`, one factory per tier a fork provides."""

from __future__ import annotations

import importlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from rl.conformance.capabilities import Capabilities

if TYPE_CHECKING:
    from fakes.grpo_sim import GrpoDriver
    from rl.protocols import Artifacts, RolloutEngine, Scorer, StateStore, Trainer
    from rl.types import ArtifactRef

__all__ = ["TIERS", "Implementation", "ImplementationError", "load_implementation"]

TIERS = ("artifacts", "state_store", "engine", "scorer", "trainer", "driver")
"""The factory attributes that each bind one contract of the packaged suite."""


class ImplementationError(ValueError):
    """`--rl-impl` does not name a usable implementation."""


@dataclass(frozen=True)
class Implementation:
    """The tiers a fork provides, as factories; None for a tier it does not provide (its laws then skip, saying so).

    Each factory is called afresh for every test, so every law starts from new objects.

    - `artifacts()`: a fresh, empty `rl.protocols.Artifacts` store.
    - `state_store()`: a fresh `rl.protocols.StateStore` nothing has saved to.
    - `engine(artifacts)`: a `RolloutEngine` reading adapters from `artifacts`.
    - `adapter(artifacts)`: the `ArtifactRef` (or an awaitable of it) of a version-0 adapter the engine can sample,
      stored in `artifacts`. Optional when `trainer` is given: the trainer's `init_adapter(0)` adapter is used.
    - `scorer()`: a `Scorer`.
    - `trainer(artifacts)`: a `Trainer` storing its adapters in `artifacts` (its laws sample batches with `engine`).
    - `driver`: the GRPO driver itself (not a factory): `async (config, tiers, store) -> GrpoOutcome`, like
      `rl.loop.grpo.run_grpo`; its laws run it on the simulator with the fake tiers.
    - `capabilities`: what the implementation claims (`Capabilities()`, the default, claims everything).

    `engine`, `adapter` and `trainer` receive the test's store: `artifacts()` when given, else an in-memory store.
    """

    name: str
    artifacts: Callable[[], Artifacts] | None = None
    state_store: Callable[[], StateStore] | None = None
    engine: Callable[[Artifacts], RolloutEngine] | None = None
    adapter: Callable[[Artifacts], ArtifactRef | Awaitable[ArtifactRef]] | None = None
    scorer: Callable[[], Scorer] | None = None
    trainer: Callable[[Artifacts], Trainer] | None = None
    driver: GrpoDriver | None = None
    capabilities: Capabilities = field(default_factory=Capabilities)

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name not in ("name", "capabilities") and value is not None and not callable(value):
                raise ImplementationError(
                    f"Implementation {self.name!r}: `{f.name}` must be callable or None, got {type(value).__name__}"
                )
        if not isinstance(self.capabilities, Capabilities):
            raise ImplementationError(
                f"Implementation {self.name!r}: `capabilities` must be a rl.conformance.Capabilities, "
                f"got {type(self.capabilities).__name__}"
            )


def load_implementation(spec: str) -> Implementation:
    """Import `module:attr` (attr may be dotted) and return it as an `Implementation`.

    Any object with some of the factory attributes (`artifacts`, `engine`, ..., `capabilities`) is accepted and wrapped.
    """
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ImplementationError(f"--rl-impl {spec!r} must look like 'package.module:ATTRIBUTE'")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ImplementationError(f"--rl-impl {spec!r}: cannot import {module_name!r}: {exc}") from exc
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ImplementationError(f"--rl-impl {spec!r}: {module_name!r} has no attribute {attr!r}") from None
    if isinstance(obj, Implementation):
        return obj
    found = {name: getattr(obj, name, None) for name in (*TIERS, "adapter")}
    if not any(value is not None for value in found.values()):
        raise ImplementationError(
            f"--rl-impl {spec!r} names a {type(obj).__name__} with none of the factories {', '.join(TIERS)}; "
            "bind an rl.conformance.Implementation"
        )
    return Implementation(
        name=str(getattr(obj, "name", spec)),
        capabilities=getattr(obj, "capabilities", None) or Capabilities(),
        **found,
    )
