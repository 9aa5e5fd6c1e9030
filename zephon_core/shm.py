"""Arrays across process boundaries through shared memory.

`pack` moves every large numpy array of a message into one file under
/dev/shm and leaves a small reference in its place; `unpack` maps that file,
unlinks it at once (the mapping outlives the name, so nothing can leak once a
message has been received) and rebuilds the arrays as views of the mapping:
no pickled copy of pixel data is ever made.
"""

from __future__ import annotations

import dataclasses
import itertools
import mmap
import os
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

SHM_DIR = Path("/dev/shm")
MIN_BYTES = 4096
_ALIGN = 64
_counter = itertools.count()


class _ArrayRef(NamedTuple):
    offset: int
    dtype: str
    shape: tuple


class Packed(NamedTuple):
    body: Any
    segment: str | None
    size: int


def available() -> bool:
    return SHM_DIR.is_dir() and os.access(SHM_DIR, os.W_OK)


def _walk(obj: Any, is_leaf, fn) -> Any:
    """Rebuild `obj` with `fn` applied to every leaf for which `is_leaf` holds."""
    if is_leaf(obj):
        return fn(obj)
    if isinstance(obj, dict):
        return {k: _walk(v, is_leaf, fn) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_walk(v, is_leaf, fn) for v in obj]
    if type(obj) is tuple:
        return tuple(_walk(v, is_leaf, fn) for v in obj)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(_walk(v, is_leaf, fn) for v in obj))
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.replace(obj, **{f.name: _walk(getattr(obj, f.name), is_leaf, fn)
                                           for f in dataclasses.fields(obj) if f.init})
    return obj


def _is_array(obj: Any) -> bool:
    return isinstance(obj, np.ndarray)


def _is_ref(obj: Any) -> bool:
    return isinstance(obj, _ArrayRef)


def pack(obj: Any, prefix: str) -> Packed:
    """Replace large arrays in `obj` by references into one new shared-memory file."""
    if not available():
        return Packed(obj, None, 0)
    arrays: list[np.ndarray] = []
    offset = 0

    def take(a: np.ndarray) -> Any:
        nonlocal offset
        if a.nbytes < MIN_BYTES or a.dtype.hasobject:
            return a
        a = np.ascontiguousarray(a)
        ref = _ArrayRef(offset, a.dtype.str, a.shape)
        arrays.append(a)
        offset += -(-a.nbytes // _ALIGN) * _ALIGN
        return ref

    body = _walk(obj, _is_array, take)
    if not arrays:
        return Packed(obj, None, 0)
    name = f"{prefix}{os.getpid()}-{next(_counter)}"
    fd = os.open(SHM_DIR / name, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.ftruncate(fd, offset)
        with mmap.mmap(fd, offset) as mm:
            at = 0
            for a in arrays:
                mm[at:at + a.nbytes] = a.reshape(-1).view(np.uint8).data
                at += -(-a.nbytes // _ALIGN) * _ALIGN
    finally:
        os.close(fd)
    return Packed(body, name, offset)


def unpack(packed: Packed) -> Any:
    """Rebuild a message; its shared-memory file is unlinked here."""
    if packed.segment is None:
        return packed.body
    path = SHM_DIR / packed.segment
    fd = os.open(path, os.O_RDWR)
    try:
        mm = mmap.mmap(fd, packed.size)
    finally:
        os.close(fd)
        os.unlink(path)

    def give(ref: _ArrayRef) -> np.ndarray:
        count = int(np.prod(ref.shape, dtype=np.int64))
        return np.frombuffer(mm, np.dtype(ref.dtype), count, ref.offset).reshape(ref.shape)

    return _walk(packed.body, _is_ref, give)


def discard(packed: Packed) -> None:
    """Remove the file of a message that will never be received."""
    if packed.segment is not None:
        (SHM_DIR / packed.segment).unlink(missing_ok=True)


def remove_leftovers(prefix: str) -> int:
    """Unlink every segment whose name starts with `prefix` (after workers died)."""
    if not available():
        return 0
    n = 0
    for p in SHM_DIR.glob(f"{prefix}*"):
        p.unlink(missing_ok=True)
        n += 1
    return n


def sweep_orphans(prefix: str = "zephon-") -> int:
    """Unlink segments left by pools whose owning process no longer exists (it was killed).

    Pool prefixes are ``zephon-<owner pid>-<id>-``; a segment whose owner is
    gone can never be received.
    """
    if not available():
        return 0
    n = 0
    for p in SHM_DIR.glob(f"{prefix}*"):
        owner = p.name[len(prefix):].split("-", 1)[0]
        if not owner.isdigit():
            continue
        try:
            os.kill(int(owner), 0)
        except ProcessLookupError:
            p.unlink(missing_ok=True)
            n += 1
        except PermissionError:
            pass
    return n
