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
"""

from __future__ import annotations

import errno
import fcntl
import itertools
import mmap
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from zephon_core.common.leaves import SCALARS, map_leaves
from zephon_core.records import Origin, Pointer

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


def _collect(obj: Any) -> tuple[Any, list[np.ndarray], int]:
    """Swap large arrays for references at aligned offsets; returns (body, arrays, bytes)."""
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


class SegmentPool:
    """A sender's reusable shared-memory files (see the module docstring).

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
    them is garbage, so is that array, and the file is released."""
    whole = np.frombuffer(mm, np.uint8, packed.size)
    weakref.finalize(whole, on_release, packed.segment).atexit = False

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
        if p.name != f"{prefix}{LOCK}":
            p.unlink(missing_ok=True)
            n += 1
    return n


def abandon(prefix: str, wait_s: float = 2.0) -> None:
    """The driver of pool `prefix` is gone: remove its segments, and its lock once free.

    A dying process closes its files one by one, so its lock may still be held
    for a moment after its pipe reads EOF: the lock is retried for `wait_s`.
    """
    if not available():
        return
    remove_leftovers(prefix)
    lock = SHM_DIR / f"{prefix}{LOCK}"
    deadline = time.monotonic() + wait_s
    while not _lock_is_free(lock):
        if time.monotonic() > deadline:
            return  # still held (a forked worker shares it): the next sweep removes it
        time.sleep(0.02)
    lock.unlink(missing_ok=True)


#: share of the free space of /dev/shm the answer pools of one process runner may take:
#: the rest is for requests, answers that did not fit a pool, and other jobs
POOL_SHARE = 0.5
#: below this pool size per worker, answers mostly travel one-shot or pickled (slow)
MIN_POOL_BYTES = 16 << 20


def pool_bytes(workers: int, free: int) -> int:
    """Per-worker pool cap, so that the pools of `workers` fit what /dev/shm has free."""
    fit = int(free * POOL_SHARE) // max(1, workers)
    return min(SegmentPool.MAX_BYTES, fit // SegmentPool.GRAIN * SegmentPool.GRAIN)


LOCK = "lock"


class OwnerLock:
    """The lock file that marks a pool's segments as owned by a live process.

    The driver holds an exclusive `flock` on ``<prefix>lock`` for the pool's
    life. The file is locked under a hidden name and then renamed into place,
    so a sweeper never sees it unlocked while its owner lives. A forked child
    closes its copy at once (`_after_fork_in_child`): a flock lives while any
    process holds the file open, so a child that kept it would keep a dead
    driver's files "owned".
    """

    def __init__(self, prefix: str) -> None:
        self.path = SHM_DIR / f"{prefix}{LOCK}"
        tmp = SHM_DIR / f".{prefix}{LOCK}"
        self.fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.rename(tmp, self.path)
        except BaseException:
            os.close(self.fd)
            tmp.unlink(missing_ok=True)
            raise
        _OWNER_LOCKS.add(self)

    def release(self) -> None:
        if self.fd >= 0:
            self.path.unlink(missing_ok=True)
            os.close(self.fd)
            self.fd = -1
        _OWNER_LOCKS.discard(self)


_OWNER_LOCKS: weakref.WeakSet[OwnerLock] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    """In a forked child: close the parent's owner locks (the parent still holds them),
    and take a fresh mapping-budget lock (a driver thread may have held the old one)."""
    _held.lock = threading.Lock()
    for owner in list(_OWNER_LOCKS):
        if owner.fd >= 0:
            try:
                os.close(owner.fd)
            except OSError:
                pass
            owner.fd = -1
    _OWNER_LOCKS.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _lock_is_free(path: Path) -> bool:
    """True when nobody holds `path`'s flock (its owner is gone); False while one does."""
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)  # closing drops a lock we took
    return True


def sweep_orphans(prefix: str = "zephon-") -> int:
    """Unlink segments left by pools whose owner is gone (it was killed).

    Pool prefixes are ``zephon-<owner pid>-<id>-``. A pool is an orphan when
    its lock file can be locked: that holds across PID namespaces, where the
    PID in the name means nothing. A pool without a lock file is left alone:
    it belongs to an older version, whose owner cannot be told apart from a
    live process in another namespace.
    """
    if not available():
        return 0
    pools: dict[str, list[Path]] = {}
    for p in SHM_DIR.glob(f"{prefix}*"):
        parts = p.name[len(prefix):].split("-", 2)
        if len(parts) == 3 and parts[0].isdigit():
            pools.setdefault(f"{prefix}{parts[0]}-{parts[1]}-", []).append(p)
    n = 0
    for pool, files in pools.items():
        lock = SHM_DIR / f"{pool}{LOCK}"
        if not lock.exists() or not _lock_is_free(lock):
            continue
        for p in sorted(files, key=lambda p: p == lock):  # the lock last
            p.unlink(missing_ok=True)
            n += 1
    return n
