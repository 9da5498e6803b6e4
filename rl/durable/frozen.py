"""What crosses a task boundary: every value is frozen into a durable record (a consumer never shares a producer's
object), and an action's identity is a digest of its scope, task, inputs and occurrence."""

from __future__ import annotations

import copy
import dataclasses
import functools
import hashlib
import inspect
import pickle
import typing
from collections.abc import Callable
from typing import Any, TypeVar

from rl.identity import content_digest

T = TypeVar("T")


class Unpicklable:
    """A record of a value pickle can't take (a class defined inside a function): kept as a private deep copy."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = copy.deepcopy(value)


class Shared:
    """A record of a value nothing can change (`immutable`): every thaw is the value itself, which is what a copy would
    be, without the pickle's cost of naming each class it holds (most of a small record's)."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


class SharedItems:
    """A record of a list or dict whose items are `immutable`: each thaw is a new container of the same items."""

    __slots__ = ("value",)

    def __init__(self, value: list[Any] | dict[str, Any]) -> None:
        self.value = value.copy()


Record = bytes | Unpicklable | Shared | SharedItems

_SCALARS = frozenset({type(None), bool, int, float, complex, str, bytes})
_FROZEN_KINDS: dict[type, bool] = {}
_MUTABLE_CONTAINERS = (list, dict, set, bytearray)


def _frozen_kind(kind: type) -> bool:
    """Instances of `kind` may be `immutable`: a class itself declared a frozen dataclass (a subclass that is not may
    set attributes of its own), or a frozen pydantic model that keeps no extra or private attributes; and no field is
    declared a list, dict or set (such instances never are, and `immutable` would walk them to find out)."""
    frozen = _FROZEN_KINDS.get(kind)
    if frozen is None:
        own = vars(kind)
        params = own.get("__dataclass_params__")
        config = getattr(kind, "model_config", None)
        frozen = "__slots__" not in own and (
            (params is not None and params.frozen)
            or (
                isinstance(config, dict)
                and config.get("frozen") is True
                and config.get("extra") in (None, "forbid", "ignore")
                and not getattr(kind, "__private_attributes__", None)
            )
        )
        _FROZEN_KINDS[kind] = False  # while its fields are read: a field of its own type is taken as mutable
        frozen = _FROZEN_KINDS[kind] = frozen and not any(_mutable(t) for t in _declared_types(kind))
    return frozen


def _declared_types(kind: type) -> list[Any]:
    fields = getattr(kind, "model_fields", None)
    if isinstance(fields, dict):
        return [f.annotation for f in fields.values()]
    try:
        return list(typing.get_type_hints(kind).values())
    except Exception:  # an annotation that does not resolve: the values are walked instead
        return []


def _mutable(declared: Any) -> bool:
    """A type that is, or may be (a union that admits one), a mutable container, or a dataclass or pydantic model
    whose instances never are `immutable`."""
    if declared in _MUTABLE_CONTAINERS or typing.get_origin(declared) in _MUTABLE_CONTAINERS:
        return True
    if isinstance(declared, type) and (dataclasses.is_dataclass(declared) or hasattr(declared, "model_fields")):
        return not _frozen_kind(declared)
    return any(_mutable(t) for t in typing.get_args(declared) if typing.get_origin(declared) is not None)


def immutable(value: Any) -> bool:
    """Whether nothing can change `value` in place: a scalar of exactly a builtin type, or a tuple, frozenset, frozen
    dataclass or frozen pydantic model of such values all the way down (`object.__setattr__` aside, which no tier
    calls). A subclass of a builtin (an enum, numpy's float64) is not taken on trust."""
    kind = type(value)
    if kind in _SCALARS:
        return True
    if kind is tuple or kind is frozenset:
        return _all_immutable(value)
    frozen = _FROZEN_KINDS.get(kind)
    if not (_frozen_kind(kind) if frozen is None else frozen):
        return False
    return _all_immutable(vars(value).values())


def _all_immutable(values: Any) -> bool:
    """Whether every one of `values` (a collection: read twice) is `immutable`; all scalars are checked in C."""
    return _SCALARS.issuperset(map(type, values)) or all(type(v) in _SCALARS or immutable(v) for v in values)


def freeze(value: Any) -> Record:
    """The durable record of a value, which no later mutation of the original can reach (pickle is ~5x deepcopy)."""
    kind = type(value)
    if kind is list or kind is dict:
        shared = _shared_items(value)
        if shared is not None:
            return shared
    elif immutable(value):
        return Shared(value)
    return _pickled(value)


def _shared_items(container: list[Any] | dict[Any, Any]) -> SharedItems | None:
    """The record of a list or dict whose items (and a dict's keys) are all `immutable`; None otherwise."""
    if isinstance(container, dict):
        shared = _all_immutable(container) and _all_immutable(container.values())
    else:
        shared = _all_immutable(container)
    return SharedItems(container) if shared else None


def _pickled(value: Any) -> bytes | Unpicklable:
    try:
        return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, AttributeError, TypeError):
        return Unpicklable(value)


def thaw(record: Record) -> Any:
    if isinstance(record, bytes):
        return pickle.loads(record)
    if isinstance(record, Shared):
        return record.value
    if isinstance(record, SharedItems):
        return record.value.copy()
    return copy.deepcopy(record.value)


def copy_value(value: T) -> T:
    return thaw(freeze(value))


_DIGESTS: dict[bytes, str] = {}


def inputs_digest(task: str, inputs: dict[str, Any]) -> tuple[str, Record]:
    """`content_digest(task, inputs)`, memoised process-wide by the inputs' pickle; and the frozen record of them.

    The canonical JSON digest was a fifth of a chaos scenario, and replays, reruns and same-seed scenarios ask it for
    the same inputs again and again. Equal pickles are equal values, so a hit returns the digest the canonical form
    would; equal values that pickle differently (another dict order) merely miss and compute it. The pickle is also
    the inputs' durable record, which each attempt thaws into its own copy, unless every input is `immutable`: then
    each attempt gets a new dict of the same values.
    """
    pickled = _pickled(inputs)
    if isinstance(pickled, Unpicklable):
        return content_digest(task, inputs), pickled
    key = hashlib.blake2b(task.encode() + b"\x00" + pickled, digest_size=16).digest()
    digest = _DIGESTS.get(key)
    if digest is None:
        if len(_DIGESTS) >= 1 << 16:
            _DIGESTS.clear()
        digest = _DIGESTS[key] = content_digest(task, inputs)
    shared = _shared_items(inputs)
    return digest, shared if shared is not None else pickled


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
