"""Bytes a lane holds in a worker's shared-memory file, named rather than copied.

An answer from a worker process reaches the lane as views of the worker's pooled
file (`shm_receive`), and that file is not reused while any view of it lives. A
row transform that sends such bytes on to another worker (the row decode sends
a row's encoded images) can therefore send where they are (`SharedBytes`: the
file, offset and length) and let that worker read them, instead of pickling
them through the pipe: one copy of a full-size photo instead of four (the
lane's ``tobytes``, the pickle, the pipe, the unpickle).

The reference is only as good as the view the lane keeps: the sender must hold
the array until the answer is back (a lane holds a row until its row stages
answer), and a file can still go away under it when the worker that wrote it
ends (its files are removed; the lane's mapping stays readable), so `read`
answers None then and the sender uses its own view.
"""

from __future__ import annotations

import os
import weakref
from typing import NamedTuple

import numpy as np

from zephon_core.engine.shm_files import SHM_DIR

#: id of a message's whole-file array (`shm_receive._views`) -> (file name, weak ref to it);
#: no lock: a dict's get and pop are atomic, and an id is reused only after the weak
#: reference's callback removed its entry
_files: dict[int, tuple[str, weakref.ref]] = {}


class SharedBytes(NamedTuple):
    """Where bytes lie in a worker's shared-memory file: what a process reads them from."""

    segment: str
    offset: int
    nbytes: int

    def read(self) -> bytes | None:
        """The bytes, or None if the file is gone (the worker that wrote it ended)."""
        try:
            fd = os.open(SHM_DIR / self.segment, os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            data = os.pread(fd, self.nbytes, self.offset)
        finally:
            os.close(fd)
        return data if len(data) == self.nbytes else None


def register(whole: np.ndarray, segment: str) -> None:
    """`whole` is the array over all of pooled file `segment` that an answer's arrays view."""
    key = id(whole)
    _files[key] = (segment, weakref.ref(whole, lambda _: _files.pop(key, None)))


def shared_bytes(a: np.ndarray) -> SharedBytes | None:
    """Where the contiguous array `a` lies in a worker's shared-memory file, if it is a view
    of an answer this process received (None otherwise: send the bytes)."""
    whole = a.base
    if not isinstance(whole, np.ndarray) or not a.flags.c_contiguous:
        return None
    found = _files.get(id(whole))
    if found is None or found[1]() is not whole:
        return None
    return SharedBytes(found[0], a.ctypes.data - whole.ctypes.data, a.nbytes)
