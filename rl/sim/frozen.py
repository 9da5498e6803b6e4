"""What crosses a task boundary: every value is frozen into a durable record (a consumer never shares a producer's
object), and an action's identity is a digest of its scope, task, inputs and occurrence."""

from __future__ import annotations

import copy
import functools
import hashlib
import inspect
import pickle
from collections.abc import Callable
from typing import Any, TypeVar

from rl.identity import content_digest

T = TypeVar("T")


class Unpicklable:
    """A record of a value pickle can't take (a class defined inside a function): kept as a private deep copy."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = copy.deepcopy(value)


def freeze(value: Any) -> bytes | Unpicklable:
    """The durable record of a value, which no later mutation of the original can reach (pickle is ~5x deepcopy)."""
    try:
        return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, AttributeError, TypeError):
        return Unpicklable(value)


def thaw(record: bytes | Unpicklable) -> Any:
    return copy.deepcopy(record.value) if isinstance(record, Unpicklable) else pickle.loads(record)


def copy_value(value: T) -> T:
    return thaw(freeze(value))


_DIGESTS: dict[bytes, str] = {}


def inputs_digest(task: str, inputs: dict[str, Any]) -> tuple[str, bytes | Unpicklable]:
    """`content_digest(task, inputs)`, memoised process-wide by the inputs' pickle; and that frozen record of them.

    The canonical JSON digest was a fifth of a chaos scenario, and replays, reruns and same-seed scenarios ask it for
    the same inputs again and again. Equal pickles are equal values, so a hit returns the digest the canonical form
    would; equal values that pickle differently (another dict order) merely miss and compute it. The pickle is also
    the inputs' durable record, which each attempt thaws into its own copy.
    """
    record = freeze(inputs)
    if isinstance(record, Unpicklable):
        return content_digest(task, inputs), record
    key = hashlib.blake2b(task.encode() + b"\x00" + record, digest_size=16).digest()
    digest = _DIGESTS.get(key)
    if digest is None:
        if len(_DIGESTS) >= 1 << 16:
            _DIGESTS.clear()
        digest = _DIGESTS[key] = content_digest(task, inputs)
    return digest, record


@functools.lru_cache(maxsize=1 << 16)
def action_identity(scope: str, task: str, digest: str, occurrence: int) -> str:
    """An action's identity (recorded histories pin it: never change the formula)."""
    return content_digest(scope, task, digest, occurrence)[:16]


_SIGNATURES: dict[tuple[Callable[..., Any], bool], tuple[inspect.Signature, tuple[str, ...] | None]] = {}


def signature_of(fn: Callable[..., Any]) -> tuple[inspect.Signature, tuple[str, ...] | None]:
    """`fn`'s signature, and its parameter names when all may be passed positionally (such calls skip `bind`).

    Every scenario wraps fresh tier objects, so the same few methods' signatures were computed again per scenario:
    they are kept by function, bound or not (a bound method's signature lacks its first parameter).
    """
    func = getattr(fn, "__func__", fn)
    key = (func, func is not fn)
    found = _SIGNATURES.get(key)
    if found is None:
        if len(_SIGNATURES) >= 1024:
            _SIGNATURES.clear()
        signature = inspect.signature(fn)
        plain = all(p.kind is p.POSITIONAL_OR_KEYWORD for p in signature.parameters.values())
        found = _SIGNATURES[key] = (signature, tuple(signature.parameters) if plain else None)
    return found
