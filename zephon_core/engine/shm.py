"""Arrays across process boundaries through shared memory.

`pack` moves every large numpy array of a message into one file under
/dev/shm and leaves a small reference in its place; `unpack` maps that file,
unlinks it at once (the mapping outlives the name, so nothing can leak once a
message has been received) and rebuilds the arrays as views of the mapping:
no pickled copy of pixel data is ever made.

A fresh file costs the kernel a page fault and a zeroed page per 4 KiB on
every message, about as much as the copy itself. Workers therefore answer
through a `SegmentPool`: files they keep mapped and reuse, one per document
of an answer. The receiver maps a pooled file without unlinking it and
reports it free (`on_release`) only once every array viewing it is gone, so
a file is never rewritten while anyone can still read it. A receiver that
keeps its mappings too (`Mappings`, the process runner's) maps each pooled
file once: no page faults when an answer is first read, no page-table
teardown when it is let go.

Writing into a mapping of a full tmpfs kills the writer with SIGBUS, so every
file's pages are reserved (`posix_fallocate`) before it is mapped: a full
/dev/shm raises ENOSPC instead, and that message travels pickled through the
pipe (`Packed.pickled`), slower but correct.

A pool's files are owned by a lock file (``<pool prefix>lock``) its driver
holds with `flock`: the lock is tied to the open file, not to a PID, so a job
in another PID namespace sharing /dev/shm can tell a live pool from a dead
one (`sweep_orphans`).

The module is the front of four: `shm_files` (the wire format, one-shot files),
`shm_pool` (a sender's pool), `shm_receive` (mapping and unpacking) and
`shm_owners` (lock files, sweeping the files of dead owners). Its names are
the ones callers have always used.
"""

from __future__ import annotations

from zephon_core.engine.shm_files import (
    MIN_BYTES,
    SHM_DIR,
    Packed,
    PackedList,
    ShmSpace,
    available,
    discard,
    is_full,
    pack,
    space,
)
from zephon_core.engine.shm_owners import LOCK, OwnerLock, abandon, remove_leftovers, sweep_orphans
from zephon_core.engine.shm_pool import MIN_POOL_BYTES, POOL_SHARE, SegmentPool, pool_bytes
from zephon_core.engine.shm_receive import Mappings, unpack

#: the names this module has always offered (`zephon_core.extend` and the runners import them)
__all__ = ["LOCK", "MIN_BYTES", "MIN_POOL_BYTES", "POOL_SHARE", "SHM_DIR", "Mappings", "OwnerLock",
           "Packed", "PackedList", "SegmentPool", "ShmSpace", "abandon",
           "available", "discard", "is_full", "pack", "pool_bytes", "remove_leftovers", "space",
           "sweep_orphans", "unpack"]
