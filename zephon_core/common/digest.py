"""SHA-256 of a batch over a canonical byte layout: the proof of identity.

Layout, for each tensor in name order: the name, the dtype, the shape (as a
UTF-8 header line ``name|dtype|d0,d1,...\\n``), then the raw bytes of the
tensor in C order, little-endian.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import numpy as np


def _as_numpy(x: Any) -> np.ndarray:
    if hasattr(x, "detach"):
        x = x.detach().cpu().contiguous().numpy()
    a = np.ascontiguousarray(np.asarray(x))
    return a.astype(a.dtype.newbyteorder("<"), copy=False)


def batch_digest(batch: Mapping[str, Any]) -> str:
    h = hashlib.sha256()
    for name in sorted(batch):
        a = _as_numpy(batch[name])
        h.update(f"{name}|{a.dtype.name}|{','.join(map(str, a.shape))}\n".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def _feed(h: Any, obj: Any) -> None:
    """Feed `obj` to `h` in a canonical, type-tagged byte layout (containers recursively)."""
    if isinstance(obj, np.ndarray) or hasattr(obj, "detach"):
        a = _as_numpy(obj)
        h.update(f"A{a.dtype.name}|{','.join(map(str, a.shape))}|".encode())
        h.update(a.tobytes())
    elif isinstance(obj, dict):
        h.update(f"D{len(obj)}|".encode())
        for k in sorted(obj, key=str):
            _feed(h, str(k))
            _feed(h, obj[k])
    elif isinstance(obj, list | tuple):
        h.update(f"L{len(obj)}|".encode())
        for v in obj:
            _feed(h, v)
    elif isinstance(obj, bytes | bytearray | memoryview):
        h.update(f"B{len(obj)}|".encode())
        h.update(bytes(obj))
    elif isinstance(obj, str):
        data = obj.encode()
        h.update(f"S{len(data)}|".encode())
        h.update(data)
    elif obj is None or isinstance(obj, bool | int | float | np.generic):
        h.update(f"V{obj!r}|".encode())
    else:
        text = repr(obj).encode()
        h.update(f"R{type(obj).__name__}|{len(text)}|".encode())
        h.update(text)


def payload_digest(obj: Any) -> str:
    """SHA-256 of any payload (nested dicts, lists, arrays, tensors, text, numbers)."""
    h = hashlib.sha256()
    _feed(h, obj)
    return h.hexdigest()


#: hex digits kept per field of a sample digest: 64 bits tell samples apart in a ledger
SAMPLE_DIGEST_HEX = 16


def sample_digest(payload: Any) -> dict[str, str]:
    """Per-field digests of one sample's payload, so a difference names its field.

    A mapping payload gets one digest per top-level key (``tokens``,
    ``pixel_values``, ...); any other payload one digest under ``payload``.
    """
    if isinstance(payload, dict):
        return {str(k): payload_digest(v)[:SAMPLE_DIGEST_HEX]
                for k, v in sorted(payload.items(), key=lambda kv: str(kv[0]))}
    return {"payload": payload_digest(payload)[:SAMPLE_DIGEST_HEX]}
