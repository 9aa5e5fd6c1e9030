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
a file is never rewritten while anyone can still read it.
"""

from __future__ import annotations

import dataclasses
import itertools
import mmap
import os
import threading
import weakref
from collections.abc import Callable
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
    pooled: bool = False


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

    body = _walk(obj, _is_array, take)
    return body, arrays, offset


def _aligned(n: int, to: int = _ALIGN) -> int:
    return -(-n // to) * to


def _write(mm: mmap.mmap, arrays: list[np.ndarray]) -> None:
    at = 0
    for a in arrays:
        mm[at:at + a.nbytes] = a.reshape(-1).view(np.uint8).data
        at += _aligned(a.nbytes)


def pack(obj: Any, prefix: str) -> Packed:
    """Replace large arrays in `obj` by references into one new shared-memory file."""
    if not available():
        return Packed(obj, None, 0)
    body, arrays, size = _collect(obj)
    if not arrays:
        return Packed(obj, None, 0)
    return _one_shot(body, arrays, size, prefix)


def _one_shot(body: Any, arrays: list[np.ndarray], size: int, prefix: str) -> Packed:
    name = f"{prefix}{os.getpid()}-{next(_counter)}"
    fd = os.open(SHM_DIR / name, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.ftruncate(fd, size)
        with mmap.mmap(fd, size) as mm:
            _write(mm, arrays)
    finally:
        os.close(fd)
    return Packed(body, name, size)


class PackedList(NamedTuple):
    """A list sent item by item, each item in its own file: an item the receiver keeps
    long (a document waiting in an open packer bin) pins only its own file."""

    items: list[Packed]


class SegmentPool:
    """A sender's reusable shared-memory files (see the module docstring).

    The files take at most `max_bytes`; when that is all still held by the
    receiver, an item falls back to a one-shot file, so a slow receiver costs
    speed, never correctness.
    """

    GRAIN = 1 << 18

    def __init__(self, prefix: str, max_bytes: int = 512 << 20) -> None:
        self.base = prefix
        self.prefix = f"{prefix}{os.getpid()}-p"
        self.max_bytes = max_bytes
        self.bytes = 0
        self._maps: dict[str, mmap.mmap] = {}
        self._free: set[str] = set()
        self._ids = itertools.count()

    def release(self, names: list[str]) -> None:
        """The receiver no longer reads these files; names not of this pool are ignored."""
        self._free.update(n for n in names if n in self._maps)

    def pack(self, items: list[Any]) -> PackedList | Packed:
        if not available():
            return Packed(items, None, 0)
        return PackedList([self._pack_one(x) for x in items])

    def _pack_one(self, obj: Any) -> Packed:
        body, arrays, size = _collect(obj)
        if not arrays:
            return Packed(obj, None, 0)
        name = self._take(size)
        if name is None:
            return _one_shot(body, arrays, size, self.base)
        _write(self._maps[name], arrays)
        return Packed(body, name, size, pooled=True)

    def _take(self, size: int) -> str | None:
        """The smallest free file that fits, else a new one, dropping free files for room."""
        fits = [n for n in self._free if len(self._maps[n]) >= size]
        if fits:
            name = min(fits, key=lambda n: len(self._maps[n]))
            self._free.discard(name)
            return name
        need = _aligned(size, self.GRAIN)
        for old in sorted(self._free, key=lambda n: len(self._maps[n])):
            if self.bytes + need <= self.max_bytes:
                break
            self._drop(old)
        if self.bytes + need > self.max_bytes:
            return None
        name = f"{self.prefix}{next(self._ids)}"
        fd = os.open(SHM_DIR / name, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            os.ftruncate(fd, need)
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
        self._free.discard(name)
        mm = self._maps.pop(name)
        self.bytes -= len(mm)
        mm.close()
        (SHM_DIR / name).unlink(missing_ok=True)


def unpack(packed: Packed | PackedList,
           on_release: Callable[[str], None] | None = None) -> Any:
    """Rebuild a message. A one-shot file is unlinked here; a pooled one is handed to
    `on_release` once the last array viewing it is garbage."""
    if isinstance(packed, PackedList):
        return [unpack(p, on_release) for p in packed.items]
    if packed.segment is None:
        return packed.body
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

    out = _walk(packed.body, _is_ref, give)
    if copy:
        mm.close()
        on_release(packed.segment)
    return out


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
