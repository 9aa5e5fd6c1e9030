"""One walk over a payload's leaves (arrays, or shared-memory references to them).

A payload nests dicts, lists, tuples, NamedTuples and dataclasses (a dataclass may name
the only fields that can hold a leaf in a class attribute ``leaf_fields``); the shared-memory
transport swaps its large arrays for references and back, and the backlog counts the
bytes of the same arrays. Both follow these container rules, so an array the transport
moves is an array the backlog counts. Anything else (a set, an object of another class)
is opaque: kept as it is and never entered.

`payload_digest` (`common.digest`) walks on its own: its canonical byte layout tags
every value (strings, numbers, token lists) and must never change, so it is not a leaf
walk.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Iterable, Iterator
from typing import Any

__all__ = ["SCALARS", "iter_leaves", "map_leaves"]

#: types that never hold a leaf: returned at once, without a leaf test
SCALARS: frozenset[type] = frozenset({int, float, str, bytes, bool, type(None)})


def map_leaves(obj: Any, is_leaf: Callable[[Any], bool], fn: Callable[[Any], Any],
               plain: Collection[type] = SCALARS) -> Any:
    """`obj` with `fn` applied to every leaf. A container some leaf below changed in is
    copied (a dataclass through `dataclasses.replace` of its init fields); one where none
    did is returned as it is, not rebuilt: the transport walks every message, and
    rebuilding a record that holds no array (an image's settings beside its bytes) ran
    its validation once per item per message. Anything else is kept. Types in `plain` are
    kept without a leaf test (the caller's own leaf-free records)."""
    if type(obj) in plain:
        return obj
    if is_leaf(obj):
        return fn(obj)
    if isinstance(obj, dict):
        items = {k: map_leaves(v, is_leaf, fn, plain) for k, v in obj.items()}
        return obj if _same(items.values(), obj.values()) else items
    if isinstance(obj, list):
        out = [map_leaves(v, is_leaf, fn, plain) for v in obj]
        return obj if _same(out, obj) else out
    if type(obj) is tuple or _is_namedtuple(obj):
        out = [map_leaves(v, is_leaf, fn, plain) for v in obj]
        if _same(out, obj):
            return obj
        return tuple(out) if type(obj) is tuple else type(obj)(*out)
    if _is_dataclass(obj):
        names = _leaf_fields(type(obj))
        old = [getattr(obj, n) for n in names]
        new = [map_leaves(v, is_leaf, fn, plain) for v in old]
        if _same(new, old):
            return obj
        return dataclasses.replace(obj, **dict(zip(names, new, strict=True)))
    return obj


def _same(new: Iterable[Any], old: Iterable[Any]) -> bool:
    """Every item of `new` is the very object at its place in `old`."""
    return all(a is b for a, b in zip(new, old, strict=True))


def iter_leaves(obj: Any, is_leaf: Callable[[Any], bool],
                plain: Collection[type] = SCALARS) -> Iterator[Any]:
    """The leaves `map_leaves` would hand to its `fn`, in the same order, without
    rebuilding anything."""
    if type(obj) in plain:
        return
    if is_leaf(obj):
        yield obj
        return
    if isinstance(obj, dict):
        children: Any = obj.values()
    elif isinstance(obj, list) or type(obj) is tuple or _is_namedtuple(obj):
        children = obj
    elif _is_dataclass(obj):
        children = (getattr(obj, n) for n in _leaf_fields(type(obj)))
    else:
        return
    for v in children:
        yield from iter_leaves(v, is_leaf, plain)


#: dataclass type -> the fields a walk enters (`_leaf_fields`)
_FIELDS: dict[type, tuple[str, ...]] = {}


def _leaf_fields(cls: type) -> tuple[str, ...]:
    """The fields of dataclass `cls` a walk enters: those it names in a class attribute
    ``leaf_fields`` (a record that knows where its arrays are: a planned image's bytes,
    not its settings), else every init field. Kept per type: the walk meets the same
    few types thousands of times a step."""
    names = _FIELDS.get(cls)
    if names is None:
        names = getattr(cls, "leaf_fields", None)
        if names is None:
            names = tuple(f.name for f in dataclasses.fields(cls) if f.init)
        _FIELDS[cls] = names = tuple(names)
    return names


def _is_namedtuple(obj: Any) -> bool:
    return isinstance(obj, tuple) and hasattr(obj, "_fields")


def _is_dataclass(obj: Any) -> bool:
    return dataclasses.is_dataclass(obj) and not isinstance(obj, type)
