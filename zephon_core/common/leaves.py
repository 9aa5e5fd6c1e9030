"""One walk over a payload's leaves (arrays, or shared-memory references to them).

A payload nests dicts, lists, tuples, NamedTuples and dataclasses; the shared-memory
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
from collections.abc import Callable, Collection, Iterator
from typing import Any

__all__ = ["SCALARS", "iter_leaves", "map_leaves"]

#: types that never hold a leaf: returned at once, without a leaf test
SCALARS: frozenset[type] = frozenset({int, float, str, bytes, bool, type(None)})


def map_leaves(obj: Any, is_leaf: Callable[[Any], bool], fn: Callable[[Any], Any],
               plain: Collection[type] = SCALARS) -> Any:
    """Rebuild `obj` with `fn` applied to every leaf; containers are copied (a dataclass
    through `dataclasses.replace` of its init fields), anything else kept. Types in
    `plain` are kept without a leaf test (the caller's own leaf-free records)."""
    if type(obj) in plain:
        return obj
    if is_leaf(obj):
        return fn(obj)
    if isinstance(obj, dict):
        return {k: map_leaves(v, is_leaf, fn, plain) for k, v in obj.items()}
    if isinstance(obj, list):
        return [map_leaves(v, is_leaf, fn, plain) for v in obj]
    if type(obj) is tuple:
        return tuple(map_leaves(v, is_leaf, fn, plain) for v in obj)
    if _is_namedtuple(obj):
        return type(obj)(*(map_leaves(v, is_leaf, fn, plain) for v in obj))
    if _is_dataclass(obj):
        return dataclasses.replace(obj, **{
            f.name: map_leaves(getattr(obj, f.name), is_leaf, fn, plain)
            for f in dataclasses.fields(obj) if f.init})
    return obj


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
        children = (getattr(obj, f.name) for f in dataclasses.fields(obj) if f.init)
    else:
        return
    for v in children:
        yield from iter_leaves(v, is_leaf, plain)


def _is_namedtuple(obj: Any) -> bool:
    return isinstance(obj, tuple) and hasattr(obj, "_fields")


def _is_dataclass(obj: Any) -> bool:
    return dataclasses.is_dataclass(obj) and not isinstance(obj, type)
