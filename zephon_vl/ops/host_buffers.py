"""Recycled host memory for the collate's pixel tensors.

A step's pixel tensor is tens to hundreds of MB, written once by the collate.
Fresh memory of that size comes from the kernel page by page: on the 2-core
development machine the page faults of 62 MB cost 26 ms, the copy itself 3 to
8 ms (docs/collate.md). The collate therefore writes into buffers it has
used before, but only into one that nothing references any more: a buffer
returns to the pool when the last array or tensor viewing it is freed (a
`weakref.finalize` on the view handed out), so a batch the trainer still
holds is never overwritten.
"""

from __future__ import annotations

import threading
import weakref

import numpy as np

#: outputs smaller than this come from `np.empty` (their page faults are cheap)
MIN_BYTES = 1 << 20
#: a new buffer's headroom over the request, so the next steps (of varying size) fit
HEADROOM = 1.25


class HostBuffers:
    """A pool of host buffers, each handed out to one array at a time.

    `keep` bounds the free buffers held between steps (the largest are kept),
    so the pool holds at most what the collate's outputs needed at once plus
    `keep` buffers.
    """

    def __init__(self, keep: int = 3) -> None:
        self.keep = keep
        self.reused = 0
        self.allocated = 0
        self._free: list[np.ndarray] = []
        self._lock = threading.Lock()

    def empty(self, shape: tuple[int, ...], dtype: np.dtype | type) -> np.ndarray:
        """An uninitialized C-contiguous array of `shape` and `dtype`, from the pool."""
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if nbytes < MIN_BYTES:
            return np.empty(shape, dtype)
        with self._lock:
            fits = [i for i, b in enumerate(self._free) if nbytes <= b.nbytes <= 2 * nbytes]
            buf = None
            if fits:
                buf = self._free.pop(min(fits, key=lambda i: self._free[i].nbytes))
                self.reused += 1
        if buf is None:
            buf = np.empty(-(-int(nbytes * HEADROOM) // MIN_BYTES) * MIN_BYTES, np.uint8)
            self.allocated += 1
        view = buf[:nbytes].view(dtype).reshape(shape)
        weakref.finalize(view, self._release, buf)
        return view

    def _release(self, buf: np.ndarray) -> None:
        with self._lock:
            self._free.append(buf)
            if len(self._free) > self.keep:
                self._free.sort(key=lambda b: b.nbytes)
                del self._free[0]

    def held_bytes(self) -> int:
        """Bytes of the free buffers waiting in the pool."""
        with self._lock:
            return sum(b.nbytes for b in self._free)
