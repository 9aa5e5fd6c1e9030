"""A sender's reusable shared-memory files (see `shm`'s docstring), and their size.

A fresh file costs the kernel a page fault and a zeroed page per 4 KiB on
every message; workers answer through a `SegmentPool` whose files they keep
mapped and reuse. `pool_bytes` sizes the pools of one runner's workers to
what /dev/shm has free.
"""

from __future__ import annotations

import itertools
import mmap
import os
from typing import Any

from zephon_core.engine.shm_files import (
    SHM_DIR,
    Packed,
    PackedList,
    _aligned,
    _collect,
    _create,
    _one_shot,
    _write,
    available,
    is_full,
)


class SegmentPool:
    """A sender's reusable shared-memory files (see `shm`'s docstring).

    The files take at most `max_bytes`; when that is all still held by the
    receiver, an item falls back to a one-shot file, so a slow receiver costs
    speed, never correctness. When /dev/shm itself is full the pool stops
    growing and the item travels pickled.

    A free file no item has needed for `idle_takes` items since its release is
    removed, so a pool grown for a burst (long clips, answers held a while)
    shrinks back to what the answers in flight need.
    """

    GRAIN = 1 << 18
    MAX_BYTES = 512 << 20
    IDLE_TAKES = 1024

    def __init__(self, prefix: str, max_bytes: int = MAX_BYTES,
                 idle_takes: int = IDLE_TAKES) -> None:
        self.base = prefix
        self.prefix = f"{prefix}{os.getpid()}-p"
        self.max_bytes = max_bytes
        self.idle_takes = idle_takes
        self.bytes = 0
        self._dropped: list[str] = []
        self._maps: dict[str, mmap.mmap] = {}
        #: free files, each with the count of items pooled when it was released
        self._free: dict[str, int] = {}
        self._takes = 0
        self._ids = itertools.count()
        #: asked once: a check per answer costs two system calls
        self.usable = available()

    def names(self) -> set[str]:
        """The pool's files now."""
        return set(self._maps)

    def release(self, names: list[str]) -> None:
        """The receiver no longer reads these files; names not of this pool are ignored."""
        self._free.update((n, self._takes) for n in names if n in self._maps)

    def pack(self, items: list[Any]) -> PackedList | Packed:
        if not self.usable:
            return Packed(items, None, 0)
        self._trim()
        packed = PackedList([self._pack_one(x) for x in items], tuple(self._dropped))
        self._dropped.clear()
        return packed

    def _pack_one(self, obj: Any) -> Packed:
        body, arrays, size = _collect(obj)
        if not arrays:
            return Packed(obj, None, 0)
        try:
            name = self._take(size)
            if name is None:
                return _one_shot(body, arrays, size, self.base)
        except OSError as exc:
            if not is_full(exc):
                raise
            self.max_bytes = self.bytes
            return Packed(obj, None, 0, pickled=True)
        _write(self._maps[name], arrays)
        return Packed(body, name, size, pooled=True)

    def _trim(self) -> None:
        for name in [n for n, at in self._free.items() if self._takes - at > self.idle_takes]:
            self._drop(name)

    def _take(self, size: int) -> str | None:
        """The smallest free file that fits (the last released of those: the others can
        age out), else a new one, dropping free files for room."""
        self._takes += 1
        fits = [n for n in self._free if len(self._maps[n]) >= size]
        if fits:
            name = min(fits, key=lambda n: (len(self._maps[n]), -self._free[n]))
            del self._free[name]
            return name
        need = _aligned(size, self.GRAIN)
        for old in sorted(self._free, key=lambda n: len(self._maps[n])):
            if self.bytes + need <= self.max_bytes:
                break
            self._drop(old)
        if self.bytes + need > self.max_bytes:
            return None
        name = f"{self.prefix}{next(self._ids)}"
        fd = _create(name, need)
        try:
            self._maps[name] = mmap.mmap(fd, need)
        finally:
            os.close(fd)
        self.bytes += need
        return name

    def close(self) -> None:
        """Unlink every file; a receiver's mapping stays valid until it lets go."""
        for name in list(self._maps):
            self._drop(name)

    def _drop(self, name: str) -> None:
        self._free.pop(name, None)
        mm = self._maps.pop(name)
        self.bytes -= len(mm)
        mm.close()
        (SHM_DIR / name).unlink(missing_ok=True)
        self._dropped.append(name)


#: share of the free space of /dev/shm the answer pools of one process runner may take:
#: the rest is for requests, answers that did not fit a pool, and other jobs
POOL_SHARE = 0.5
#: below this pool size per worker, answers mostly travel one-shot or pickled (slow)
MIN_POOL_BYTES = 16 << 20


def pool_bytes(workers: int, free: int) -> int:
    """Per-worker pool cap, so that the pools of `workers` fit what /dev/shm has free."""
    fit = int(free * POOL_SHARE) // max(1, workers)
    return min(SegmentPool.MAX_BYTES, fit // SegmentPool.GRAIN * SegmentPool.GRAIN)

