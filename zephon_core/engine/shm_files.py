"""The wire format of arrays sent through shared memory (see `shm`'s docstring).

`pack` moves every large numpy array of a message into one file under
/dev/shm and leaves a small reference in its place (`Packed`); a pooled
sender (`shm_pool`) and the receiver (`shm_receive`) build on these pieces.
"""

from __future__ import annotations

import errno
import itertools
import mmap
import os
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from zephon_core.common.leaves import SCALARS, map_leaves
from zephon_core.records import Element, Origin, Pointer

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
    pooled: bool = False
    #: the arrays are in `body`, pickled: /dev/shm had no room for them
    pickled: bool = False


class ShmSpace(NamedTuple):
    free: int
    total: int

    def __str__(self) -> str:
        return f"{_mib(self.free)} free of {_mib(self.total)}"


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.0f} MiB"


def space() -> ShmSpace:
    """What /dev/shm has now (0 of 0 where it is missing)."""
    try:
        st = os.statvfs(SHM_DIR)
    except OSError:
        return ShmSpace(0, 0)
    return ShmSpace(st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize)


def is_full(exc: BaseException) -> bool:
    """True for the error of a /dev/shm without room (space or inodes)."""
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)


def available() -> bool:
    return SHM_DIR.is_dir() and os.access(SHM_DIR, os.W_OK)


#: types that are never a leaf nor hold one (most of a message's values), answered first
_PLAIN = SCALARS | {Origin, Pointer}


def _is_array(obj: Any) -> bool:
    return isinstance(obj, np.ndarray)


def _is_ref(obj: Any) -> bool:
    return isinstance(obj, _ArrayRef)


def _plain_elements(obj: Any) -> bool:
    """`obj` is a group of elements whose payloads are pointers (or other plain values): the
    usual group sent to a first stage, which holds no array to look for."""
    return type(obj) is list and all(type(e) is Element and type(e.payload) in _PLAIN
                                     and type(e.origin) in _PLAIN for e in obj)


def _collect(obj: Any) -> tuple[Any, list[np.ndarray], int]:
    """Swap large arrays for references at aligned offsets; returns (body, arrays, bytes)."""
    if _plain_elements(obj):
        return obj, [], 0
    arrays: list[np.ndarray] = []
    offset = 0

    def take(a: np.ndarray) -> Any:
        nonlocal offset
        if a.nbytes < MIN_BYTES or a.dtype.hasobject:
            return a
        a = np.ascontiguousarray(a)
        ref = _ArrayRef(offset, a.dtype.str, a.shape)
        arrays.append(a)
        offset += _aligned(a.nbytes)
        return ref

    body = map_leaves(obj, _is_array, take, _PLAIN)
    return body, arrays, offset


def _aligned(n: int, to: int = _ALIGN) -> int:
    return -(-n // to) * to


def _write(mm: mmap.mmap, arrays: list[np.ndarray]) -> None:
    at = 0
    for a in arrays:
        mm[at:at + a.nbytes] = a.reshape(-1).view(np.uint8).data
        at += _aligned(a.nbytes)


def pack(obj: Any, prefix: str) -> Packed:
    """Replace large arrays in `obj` by references into one new shared-memory file
    (left in place, pickled, when /dev/shm is full)."""
    body, arrays, size = _collect(obj)
    if not arrays or not available():
        return Packed(obj, None, 0)
    try:
        return _one_shot(body, arrays, size, prefix)
    except OSError as exc:
        if not is_full(exc):
            raise
        return Packed(obj, None, 0, pickled=True)


def _create(name: str, size: int) -> int:
    """A new file of `size` reserved bytes; ENOSPC here, never SIGBUS at a later write."""
    path = SHM_DIR / name
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.ftruncate(fd, size)
        try:
            os.posix_fallocate(fd, 0, size)
        except OSError as exc:
            if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                raise
    except BaseException:
        os.close(fd)
        path.unlink(missing_ok=True)
        raise
    return fd


def _one_shot(body: Any, arrays: list[np.ndarray], size: int, prefix: str) -> Packed:
    name = f"{prefix}{os.getpid()}-{next(_counter)}"
    fd = _create(name, size)
    try:
        with mmap.mmap(fd, size) as mm:
            _write(mm, arrays)
    finally:
        os.close(fd)
    return Packed(body, name, size)


class PackedList(NamedTuple):
    """A list sent item by item, each item in its own file: an item the receiver keeps
    long (a document waiting in an open packer bin) pins only its own file."""

    items: list[Packed]
    #: pooled files the sender removed since its last message: a receiver that keeps
    #: mappings (`Mappings`) forgets them
    dropped: tuple[str, ...] = ()


def discard(packed: Packed) -> None:
    """Remove the file of a message that will never be received."""
    if packed.segment is not None:
        (SHM_DIR / packed.segment).unlink(missing_ok=True)
