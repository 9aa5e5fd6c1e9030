"""SHA-256 of a batch over a canonical byte layout: the proof of identity.

Layout, for each tensor in name order: the name, the dtype, the shape (as a
UTF-8 header line ``name|dtype|d0,d1,...\\n``), then the raw bytes of the
tensor in C order, little-endian.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from typing import Any

import numpy as np
import xxhash


def _as_numpy(x: Any) -> np.ndarray:
    if hasattr(x, "detach"):
        x = x.detach().cpu().contiguous().numpy()
    a = np.ascontiguousarray(np.asarray(x))
    return a.astype(a.dtype.newbyteorder("<"), copy=False)


def batch_digest(batch: Mapping[str, Any]) -> str:
    """SHA-256 (hex) of a batch: every tensor's name, dtype, shape and bytes, in name order.

    Two batches with the same digest are bit-identical, so comparing digests across rank
    counts, resumes and machines checks guarantee 3 without keeping the batches
    (`zephon-vl digest`, the ledger, `zephon-vl verify`).
    """
    h = hashlib.sha256()
    for name in sorted(batch):
        a = _as_numpy(batch[name])
        h.update(f"{name}|{a.dtype.name}|{','.join(map(str, a.shape))}\n".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def _feed(h: Any, obj: Any) -> None:
    """Feed `obj` to `h` in a canonical, type-tagged byte layout (containers recursively).

    Not `common.leaves`: every value is tagged, not only arrays, and the layout (a dataclass
    as its repr) is frozen by the recorded digests."""
    if isinstance(obj, np.ndarray) or hasattr(obj, "detach"):
        a = _as_numpy(obj)
        h.update(f"A{a.dtype.name}|{','.join(map(str, a.shape))}|".encode())
        if a.dtype.hasobject:
            _feed(h, a.tolist())
        elif a.size:
            h.update(a.reshape(-1).view(np.uint8))  # the array's own bytes, no copy
    elif isinstance(obj, dict):
        h.update(f"D{len(obj)}|".encode())
        for k in sorted(obj, key=str):
            _feed(h, str(k))
            _feed(h, obj[k])
    elif isinstance(obj, list | tuple):
        if obj and all(type(v) is int for v in obj):
            h.update(f"I{len(obj)}|".encode())  # token lists: one array, not an item each
            h.update(np.asarray(obj, dtype="<i8").tobytes())
            return
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


#: the algorithm of `sample_digest`, recorded in every ledger header: ledgers hashed
#: differently are refused by a comparison rather than reported as different content
SAMPLE_DIGEST = "xxh3_64"


def sample_digest(payload: Any) -> dict[str, str]:
    """Per-field 64-bit digests of one sample's payload, so a difference names its field.

    A mapping payload gets one digest per top-level key (``tokens``,
    ``pixel_values``, ...); any other payload one digest under ``payload``.
    XXH3-64 over the same canonical layout as `payload_digest`: the workers
    hash every sample's pixels, and SHA-256 (about 1.3 GB/s) cost 8% of a
    `vlm-demo` step where XXH3 costs well under 1%. A ledger detects
    accidental differences (no adversary), for which 64 bits per field suffice.
    """
    if isinstance(payload, dict):
        return {str(k): _xxh(v) for k, v in sorted(payload.items(), key=lambda kv: str(kv[0]))}
    return {"payload": _xxh(payload)}


def _xxh(obj: Any) -> str:
    h = xxhash.xxh3_64()
    _feed(h, obj)
    return h.hexdigest()


def file_sha256(path: str | os.PathLike) -> str:
    """SHA-256 of a local file's bytes, read in 1 MiB chunks (manifests of built data)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
