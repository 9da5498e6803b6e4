"""Reading a file someone else may have written (a run directory you were sent): bounded JSON, then a typed schema.

`parse_json` refuses what Python's `json` would take but no file of ours holds, before anything uses it: bytes that
are not UTF-8, `NaN`/`Infinity` (strict JSON readers reject them, and a NaN reward would poison every mean), an integer
longer than `int`'s string limit, and nesting deeper than `MAX_DEPTH` (which would otherwise end in a `RecursionError`
somewhere later). `validate` checks the parsed value against a pydantic model in strict mode (no "1" for 1, no
1.5 for an int, no True for a number) and names the first offending field. Both raise `UntrustedValueError`, which
the caller turns into its own error family with the file's name: one line, never a traceback.
"""

from __future__ import annotations

import json
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError

from rl.errors import UntrustedValueError, shown

__all__ = ["MAX_DEPTH", "STRICT", "StrictModel", "describe", "parse_json", "shown", "validate"]

MAX_DEPTH = 32
T = TypeVar("T")

# Every model of a file we read: unknown keys refused, nothing coerced.
STRICT = ConfigDict(strict=True, extra="forbid", frozen=True)


class StrictModel(BaseModel):
    model_config = STRICT


def _refuse_constant(name: str) -> Any:
    raise UntrustedValueError(f"it holds a bare {name}, which strict JSON does not allow")


def parse_json(data: bytes | str, *, max_depth: int = MAX_DEPTH, allow_nan: bool = False) -> Any:
    """The JSON value `data` holds, refused (`UntrustedValueError`) unless strict, UTF-8 and at most `max_depth` deep.
    `allow_nan` admits bare `NaN`/`Infinity` (files written before strict JSON hold them); the schema then decides
    which fields may be non-finite."""
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
    except UnicodeDecodeError as exc:
        raise UntrustedValueError(f"it is not UTF-8 (byte {exc.start})") from None
    try:
        value = json.loads(text) if allow_nan else json.loads(text, parse_constant=_refuse_constant)
    except RecursionError:
        raise UntrustedValueError(f"it nests deeper than {max_depth} levels") from None
    except UntrustedValueError:
        raise
    except ValueError as exc:  # not JSON, or an integer longer than int's string limit
        raise UntrustedValueError(f"it is not JSON this tool wrote ({str(exc).splitlines()[0]})") from None
    _check_depth(value, max_depth)
    return value


def _check_depth(value: Any, max_depth: int) -> None:
    stack = [(value, 0)]
    while stack:
        node, depth = stack.pop()
        if depth > max_depth:
            raise UntrustedValueError(f"it nests deeper than {max_depth} levels")
        if isinstance(node, dict):
            stack.extend((v, depth + 1) for v in node.values())
        elif isinstance(node, list):
            stack.extend((v, depth + 1) for v in node)


def validate(adapter: TypeAdapter[T], value: Any, *, prefix: str = "") -> T:
    """`value` as the adapter's type, or `UntrustedValueError` naming the first field that is wrong and why."""
    try:
        return adapter.validate_python(value)
    except ValidationError as exc:
        raise UntrustedValueError(describe(exc, prefix)) from None


def describe(exc: ValidationError, prefix: str = "") -> str:
    """`field history[3].adapter_version: Input should be a valid integer (got 'x')`, for the first error."""
    err = exc.errors(include_url=False)[0]
    path = prefix
    for part in err["loc"]:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    got = err.get("input")
    got_text = repr(got) if isinstance(got, int | float | bool | type(None)) else f"a {type(got).__name__}"
    if isinstance(got, str):
        got_text = repr(shown(got, 40))
    where = f"field {shown(path, 80)}" if path else "the value"
    return f"{where}: {err['msg']} (got {got_text})"
