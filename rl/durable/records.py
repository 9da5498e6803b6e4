"""What a simulated run records: its event log lines, the actions its driver issued, and its outcome."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple


class Event(NamedTuple):
    """One line of the event log. `t` is virtual seconds since the run started.

    A named tuple, not a frozen dataclass: a scenario logs a few hundred, and a frozen dataclass sets each field
    through `object.__setattr__`."""

    t: float
    run: str
    attempt: int
    kind: str
    task: str = ""
    action: str = ""
    detail: str = ""

    def line(self) -> str:
        text = f"{self.t:014.6f} {self.run} d{self.attempt} {self.kind:<18} {self.task} {self.action} {self.detail}"
        return text.rstrip()


class ActionRecord(NamedTuple):
    """An action as issued by the driver: its identity and its task (a named tuple, as `Event`)."""

    action_id: str
    task: str


# `Event(*fields)` and `ActionRecord(*fields)` from a tuple of the fields, in C: a named tuple's `__new__` is Python.
new_event: Callable[[tuple[float, str, int, str, str, str, str]], Event] = functools.partial(tuple.__new__, Event)
new_action_record: Callable[[tuple[str, str]], ActionRecord] = functools.partial(tuple.__new__, ActionRecord)


@dataclass(frozen=True)
class RunResult:
    """The outcome of one simulated run. `error` is the user's code failing; divergence lives in `ReplayReport`."""

    run_id: str
    inputs: dict[str, Any]
    output: Any
    error: BaseException | None
    attempts: int
    crashes: int
    await_points: int
    history: tuple[ActionRecord, ...]
    virtual_time_s: float

    @property
    def ok(self) -> bool:
        return self.error is None
