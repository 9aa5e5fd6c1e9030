"""The receiving side of shared memory: rebuild a message's arrays (see `shm`'s docstring).

`unpack` maps a message's file and gives its arrays back as views of the
mapping; a pooled file is reported free (`on_release`) once no array views it.
`Mappings` keeps a sender's pooled files mapped from one answer to the next;
`_held` bounds the mappings a process keeps (each holds a file descriptor).
"""

from __future__ import annotations

import mmap
import os
import threading
import weakref
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from zephon_core.common.leaves import map_leaves
from zephon_core.engine import shm_slices
from zephon_core.engine.shm_files import _PLAIN, SHM_DIR, Packed, PackedList, _ArrayRef, _is_ref


class Mappings:
    """A receiver's mappings of a sender's pooled files, kept from one answer to the next.

    Mapping a file afresh for every answer costs a page fault per few pages when
    the answer is first read and a page-table teardown (with TLB shootdowns across
    cores) when it is let go: together about as much as copying the data twice. A
    pooled file is reused, so the receiver maps it once. The files the sender
    removes come back in its answers (`PackedList.dropped`) and are forgotten
    here; a mapping is undone once no array views it any more. Used by one thread.
    """

    def __init__(self) -> None:
        self._maps: dict[str, mmap.mmap] = {}

    def get(self, name: str) -> mmap.mmap | None:
        """The mapping of pooled file `name`; None past the mapping budget (`_held`)."""
        mm = self._maps.get(name)
        if mm is None:
            if not _held.take():
                return None
            fd = os.open(SHM_DIR / name, os.O_RDWR)
            try:
                mm = mmap.mmap(fd, 0)
            except BaseException:
                _held.give_back()
                raise
            finally:
                os.close(fd)
            weakref.finalize(mm, _held.give_back).atexit = False
            self._maps[name] = mm
        return mm

    def forget(self, names: Iterable[str]) -> None:
        for name in names:
            self._maps.pop(name, None)

    def forget_prefix(self, prefix: str) -> None:
        """Forget every file of one sender (a worker that died: its files are gone)."""
        self.forget([n for n in self._maps if n.startswith(prefix)])

    def names(self) -> set[str]:
        """The files mapped now."""
        return set(self._maps)


def unpack(packed: Packed | PackedList, on_release: Callable[[str], None] | None = None,
           mappings: Mappings | None = None) -> Any:
    """Rebuild a message. A one-shot file is unlinked here; a pooled one is handed to
    `on_release` once the last array viewing it is garbage. With `mappings` a pooled
    file is read through the receiver's kept mapping of it."""
    if isinstance(packed, PackedList):
        if mappings is not None:
            mappings.forget(packed.dropped)
        return [unpack(p, on_release, mappings) for p in packed.items]
    if packed.segment is None:
        return packed.body
    if packed.pooled and on_release is not None and mappings is not None:
        mm = mappings.get(packed.segment)
        if mm is not None:
            return _views(packed, mm, on_release)
    path = SHM_DIR / packed.segment
    fd = os.open(path, os.O_RDWR)
    try:
        mm = mmap.mmap(fd, packed.size)
    finally:
        os.close(fd)
        if not packed.pooled:
            os.unlink(path)
    copy = False
    if packed.pooled and on_release is not None:
        copy = not _held.take()
        if not copy:
            fin = weakref.finalize(mm, _let_go, on_release, packed.segment)
            fin.atexit = False

    def give(ref: _ArrayRef) -> np.ndarray:
        count = int(np.prod(ref.shape, dtype=np.int64))
        a = np.frombuffer(mm, np.dtype(ref.dtype), count, ref.offset).reshape(ref.shape)
        return a.copy() if copy else a

    out = map_leaves(packed.body, _is_ref, give, _PLAIN)
    if copy:
        mm.close()
        on_release(packed.segment)
    return out


def _views(packed: Packed, mm: mmap.mmap, on_release: Callable[[str], None]) -> Any:
    """The message's arrays as views of one array over the file's bytes: when the last of
    them is garbage, so is that array, and the file is released. Until then another
    process may read them from the file (`shm_slices`)."""
    whole = np.frombuffer(mm, np.uint8, packed.size)
    weakref.finalize(whole, on_release, packed.segment).atexit = False
    shm_slices.register(whole, packed.segment)

    def give(ref: _ArrayRef) -> np.ndarray:
        dtype = np.dtype(ref.dtype)
        end = ref.offset + int(np.prod(ref.shape, dtype=np.int64)) * dtype.itemsize
        return whole[ref.offset:end].view(dtype).reshape(ref.shape)

    return map_leaves(packed.body, _is_ref, give, _PLAIN)


class _MappingBudget:
    """Pooled mappings this process may hold: CPython's mmap keeps a file descriptor per
    mapping, so past half the open-files limit answers are copied out and released at
    once (slower, never "Too many open files")."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.held = 0
        self.limit: int | None = None  # set at first use: it may raise the process's limit

    def take(self) -> bool:
        with self.lock:
            if self.limit is None:
                self.limit = max(16, _open_files_limit() // 2)
            if self.held >= self.limit:
                return False
            self.held += 1
            return True

    def give_back(self) -> None:
        with self.lock:
            self.held -= 1


def _open_files_limit() -> int:
    """The soft open-files limit, raised towards the hard one (at most 65,536) first."""
    try:
        import resource
    except ImportError:  # not POSIX
        return 1024
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 65536 if hard == resource.RLIM_INFINITY else min(hard, 65536)
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
        except (ValueError, OSError):
            pass
    return 65536 if soft == resource.RLIM_INFINITY else soft


_held = _MappingBudget()


def _let_go(on_release: Callable[[str], None], name: str) -> None:
    _held.give_back()
    on_release(name)




def _after_fork_in_child() -> None:
    """In a forked child: take a fresh mapping-budget lock (a driver thread may have held
    the old one)."""
    _held.lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)
