"""What travels with a Ray task: a stage's group run on a Ray worker, its answer copied back.

The worker side (`run_group`) sets a stage up once per worker process and
sends exceptions back as values; the driver side copies answers out of the
object store (`own_copy`) and measures what should have travelled as uint8
(`float_bytes`). See `ray_runner` for the runner.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from typing import Any

import numpy as np

from zephon_core.engine.ray_connection import _ray
from zephon_core.engine.workers import sendable_error
from zephon_core.ops.contract import StageFn
from zephon_core.records import Element, Origin, Pointer

#: floating-point arrays at least this large in an answer earn a warning (send uint8 pixels)
FLOAT_WARN_BYTES = 64 << 10


# ---- the worker side: runs in Ray's worker processes -------------------------------------

#: the stages this worker process has set up, by runner key (a few at most)
_STAGES: OrderedDict[str, StageFn] = OrderedDict()
_KEEP_STAGES = 8


def _stage(key: str, box: list, name: str) -> StageFn:
    fn = _STAGES.get(key)
    if fn is None:
        ray = _ray()
        try:
            fn = ray.get(box[0])
            fn.setup()
        except Exception as exc:
            node = ray.get_runtime_context().get_node_id()
            raise RuntimeError(
                f"stage {name}: setting the stage up on Ray node {node[:12]} failed: "
                f"{type(exc).__name__}: {exc}. Every node that runs zephon tasks needs "
                "zephon-vl and the recipe's modules at the trainer's versions, and its files "
                "(shards, tokenizer folders) at the same paths or URLs") from exc
        _STAGES[key] = fn
        while len(_STAGES) > _KEEP_STAGES:
            _STAGES.popitem(last=False)
    return fn


def run_group(key: str, box: list, name: str, elements: list[Element]) -> tuple:
    """One group on a Ray worker: ``("ok", node, outputs)`` or ``("err", node, exception)``.

    The stage function travels once per runner (`box` holds its object
    reference, unresolved) and is set up once per worker process. Exceptions
    come back as values, so Ray never retries a group that failed on its own
    content, and the consumer sees the stage's own exception.
    """
    ray = _ray()
    node = ray.get_runtime_context().get_node_id()
    try:
        return ("ok", node, _stage(key, box, name)(elements))
    except BaseException as exc:  # noqa: BLE001 - sent back to the driver
        return ("err", node, sendable_error(exc))


# ---- the driver side ----------------------------------------------------------------------

_PLAIN = frozenset({int, float, str, bytes, bool, type(None), Origin, Pointer})


def own_copy(obj: Any) -> Any:
    """`obj` with every numpy array copied into this process's memory.

    Ray hands answers back as read-only views of its object store, which pin
    the object there as long as any view lives; a copy lets the object go at
    once and gives the stages downstream writable arrays, as the other
    runners do.
    """
    if type(obj) in _PLAIN:
        return obj
    if isinstance(obj, np.ndarray):
        return obj.copy() if not obj.flags.writeable else obj
    if isinstance(obj, dict):
        return {k: own_copy(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [own_copy(v) for v in obj]
    if type(obj) is tuple:
        return tuple(own_copy(v) for v in obj)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(own_copy(v) for v in obj))
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.replace(obj, **{f.name: own_copy(getattr(obj, f.name))
                                           for f in dataclasses.fields(obj) if f.init})
    return obj


def float_bytes(obj: Any) -> int:
    """Bytes of floating-point arrays in `obj` (what should have travelled as uint8)."""
    if isinstance(obj, np.ndarray):
        return obj.nbytes if obj.dtype.kind == "f" else 0
    if isinstance(obj, dict):
        return sum(float_bytes(v) for v in obj.values())
    if isinstance(obj, list | tuple):
        return sum(float_bytes(v) for v in obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return sum(float_bytes(getattr(obj, f.name)) for f in dataclasses.fields(obj))
    return 0

