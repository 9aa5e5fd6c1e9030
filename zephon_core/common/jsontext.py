"""JSON from samples: parsed with a depth limit, so a hostile document is a bad sample.

`json.loads` raises `RecursionError` at a depth that depends on how deep the
calling stack already is, which differs between the inline runner and a
worker process. Refusing every document nested deeper than `MAX_DEPTH` (far
below the interpreter's limit) makes the decision a function of the document
alone, so it is the same on every runner.
"""

from __future__ import annotations

import json
from typing import Any

from zephon_core.errors import BadSampleError

MAX_DEPTH = 100


def is_count(v: Any) -> bool:
    """A non-negative JSON integer (not a bool): what a count in a saved state must be."""
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


#: JSON values that hold nothing
_FLAT = (str, int, float, bool, type(None))


def depth(obj: Any) -> int:
    """How deeply `obj` nests dicts and lists (a scalar: 0)."""
    if type(obj) is dict and all(type(v) in _FLAT for v in obj.values()):
        return 1  # the usual record ({"id": ..., "text": ...}), without the walk
    deepest, stack = 0, [(obj, 1)]
    while stack:
        node, d = stack.pop()
        if isinstance(node, dict):
            deepest = max(deepest, d)
            stack.extend((v, d + 1) for v in node.values())
        elif isinstance(node, list):
            deepest = max(deepest, d)
            stack.extend((v, d + 1) for v in node)
    return deepest


def loads_sample(text: str | bytes, where: str, reason: str = "bad_json") -> Any:
    """Parse one sample's JSON; malformed or too deeply nested JSON is a bad sample."""
    try:
        obj = json.loads(text)
    except RecursionError:
        raise BadSampleError(reason, where, f"JSON nested deeper than {MAX_DEPTH} levels") \
            from None
    except ValueError as exc:
        raise BadSampleError(reason, where, f"not valid JSON ({exc})") from None
    if depth(obj) > MAX_DEPTH:
        raise BadSampleError(reason, where, f"JSON nested deeper than {MAX_DEPTH} levels")
    return obj
