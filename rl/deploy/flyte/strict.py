"""The base of the Flyte tasks' run configs: frozen pydantic models that refuse what cannot work when built.

Pydantic rather than a dataclass because Flyte's CLI (`flyte run ... --config '<json>'`) drops, without a word, the
keys a dataclass does not have, while it validates a pydantic model with the model's own rules: `extra="forbid"` here,
and `__pydantic_config__ = {"extra": "forbid"}` on the dataclasses a config nests (`GrpoConfig`, `TrainerConfig`, ...),
refuse a typo at any depth. Kept free of torch so the agentic tasks can import it.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from rl.errors import ConfigError


class StrictConfig(BaseModel):
    """A run's typed task input: frozen, unknown keys refused. Built in Python, a bad value is a `ConfigError`; from
    JSON (`model_validate`, Flyte's CLI and type engine), a pydantic `ValidationError` carrying the same message."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise ConfigError(_one_line(exc)) from None

    def replace(self, **changes: Any) -> Any:
        """A copy with `changes` applied, validated again (`dataclasses.replace` for these models)."""
        return type(self)(**{**{name: getattr(self, name) for name in type(self).model_fields}, **changes})


def _one_line(exc: ValidationError) -> str:
    problems = []
    for error in exc.errors():
        where, message = ".".join(str(p) for p in error["loc"]), error["msg"].removeprefix("Value error, ")
        problems.append(f"{where}: {message}" if where else message)
    return "; ".join(problems)
