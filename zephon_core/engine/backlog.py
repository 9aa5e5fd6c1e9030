"""How many bytes of finished documents a rank's lanes hold, and backpressure on it.

A *finished document* is a payload that a transform stage handed to an
accumulator (a payload shuffle buffer) or to the combiner:
its arrays (decoded pixels, tokens) live in the driver, usually as views of
the workers' shared memory, until the step that uses them has been collated
and dropped by everyone. Packer bins, rows waiting for their step, steps
prefetched ahead of the consumer: all of it is backlog.

The bound is enforced where the lanes draw new samples: a lane draws only
while what its rank holds, plus what is in flight in its transforms priced at
the largest document seen so far, stays within `Execution.backlog_bytes`.
Nothing is ever dropped for it, and the lane streams do not change (drawing
later never changes what is drawn). A lane that the next step is still
waiting on may always keep one group of elements in its transforms, so a
step whose rows alone need more than the bound still comes (a group at a
time) instead of deadlocking.

Bytes are counted when a payload is finished and uncounted when its arrays
are garbage (a `weakref.finalize` per array), so the count follows what is
really held, wherever the references went (a prefetched batch, a row kept by
the caller of `Loader.next_rows`).

One `Backlog` serves every lane of a rank as a lane hook (`engine.lane_hooks`):
it vetoes a lane's draw (`may_draw`) and counts each finished document
(`document`).
"""

from __future__ import annotations

import threading
import weakref
from collections import deque
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from zephon_core.common.leaves import iter_leaves
from zephon_core.engine.lane_hooks import LaneHook, LaneView
from zephon_core.records import Origin

#: arrays smaller than this are not worth a finalizer (shm.MIN_BYTES: they travel pickled)
MIN_TRACKED = 4096


class _Lane(Protocol):
    #: the lane's elements waiting for or inside a transform stage
    transforming: int


def _is_array(obj: Any) -> bool:
    return isinstance(obj, np.ndarray)


class Backlog(LaneHook):
    """The finished documents of one rank's lanes: bytes held now, at peak, and the bound.

    `limit` None counts without limiting. Read `held`, `peak` and `largest`
    from any thread; `track` and `may_draw` are for the driver thread.
    """

    def __init__(self, limit: int | None, first_group: int = 1) -> None:
        self.limit = limit
        #: elements in flight before any document has finished (nothing to price them at),
        #: and in the transforms of a lane the next step waits on, past the bound: one
        #: group, so that such a lane still sends full groups to its workers
        self.first_group = first_group
        self.documents = 0
        self._lanes: Sequence[_Lane] = ()
        self.largest = 0
        self.peak = 0
        self._added = 0
        self._freed_total = 0
        # appended by finalizers (any thread, possibly inside the driver's own code):
        # a deque's append is atomic and takes no lock that the driver could hold
        self._freed: deque[int] = deque()
        #: id -> bytes of every array counted and not yet garbage: a payload that passes
        #: another accumulator or transform (same arrays) is counted once
        self._counted: dict[int, int] = {}
        self._lock = threading.Lock()

    @property
    def held(self) -> int:
        """Bytes of finished documents not yet garbage."""
        with self._lock:  # readers only: a finalizer never takes it
            freed = self._freed
            while freed:
                self._freed_total += freed.popleft()
            return self._added - self._freed_total

    def serve(self, lanes: Sequence[_Lane]) -> None:
        """The lanes whose in-flight work `may_draw` prices: every lane of the rank, replacing
        those before (a restore builds new lanes; the old ones' work is abandoned)."""
        self._lanes = lanes

    def track(self, payload: Any) -> None:
        """Count a finished document until its arrays are garbage."""
        size = fresh = 0
        for a in iter_leaves(payload, _is_array):
            if a.nbytes < MIN_TRACKED:
                continue
            size += a.nbytes
            if id(a) in self._counted:
                continue
            self._counted[id(a)] = a.nbytes
            fresh += a.nbytes
            # the finalizer holds the two containers, never the backlog: through it the
            # registry would hold the lanes and their documents (this array too) for good
            weakref.finalize(a, _release, self._counted, self._freed, id(a)).atexit = False
        self.documents += 1
        self.largest = max(self.largest, size)
        if fresh:
            self._added += fresh
            self.peak = max(self.peak, self.held)

    def _fits(self) -> bool:
        """The rank's held bytes plus its in-flight work, priced at the largest document,
        stay within the bound with one element more."""
        if self.limit is None:
            return True
        in_transforms = sum(lane.transforming for lane in self._lanes)
        if self.documents:
            return self.held + (in_transforms + 1) * self.largest <= self.limit
        # nothing finished yet, so no size to price the in-flight work at: one group
        return in_transforms < self.first_group

    def may_draw(self, lane: LaneView) -> bool:
        """May `lane` draw one more element? While the bound holds, or while the next step
        still waits for its rows (`needy`, asked only then: this runs before every draw)
        and it has less than one group in its transforms."""
        return self._fits() or (lane.needy() and lane.transforming < self.first_group)

    def document(self, origin: Origin, payload: Any) -> None:
        self.track(payload)


def _release(counted: dict[int, int], freed: deque[int], key: int) -> None:
    """An array's finalizer: its bytes go to `freed`. It runs in whichever thread drops the
    last reference: dict.pop and deque.append are atomic, and no lock is taken that the
    interrupted code could hold."""
    freed.append(counted.pop(key, 0))
