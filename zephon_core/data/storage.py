"""Opening shards: one seam between readers and where the bytes live.

A shard reader asks `open_shard(location)` for a `StoredFile` and from then on
only calls ``read_at(offset, length)``: it never sees a file descriptor, so
the same tar index and reader work on local files and on object storage.

``location`` is a plain path, a ``file://`` URL (both read with ``pread``), or
any other URL (``s3://``, ``gs://``, ``https://``...), which is opened through
fsspec when it is installed (``pip install zephon-vl[remote]``). Credentials
and endpoints come from each filesystem's own configuration (for S3 the usual
``AWS_*`` variables, including ``AWS_ENDPOINT_URL``); nothing here stores,
logs or fingerprints them, and URLs are never resolved as local paths.

``identity`` says which version of the bytes a handle reads: the mtime for a
local file, the ETag (or mtime) for an object. An index built for one
identity is rebuilt, or refused, when it changes.

How to retry and how far to coalesce reads are execution settings
(`zephon_core.engine.execution.Execution.retry` and ``.coalesce``): they
change when bytes arrive, never which. The engine installs them for the
thread that runs a stage or builds a Loader with `storage_settings`; code
below reads them with `current_storage()`, so readers pickled into workers
need not carry them and no fingerprint sees them.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from zephon_core.common.settings import setting
from zephon_core.errors import BadSampleError

_LOCAL_SCHEMES = ("", "file")


def scheme_of(location: str | os.PathLike) -> str:
    """``"s3"`` for ``s3://b/k``; ``""`` for a plain path (Windows drive letters included)."""
    text = os.fspath(location)
    head, sep, _ = text.partition("://")
    return head.lower() if sep and head.isalnum() and len(head) > 1 else ""


def is_remote(location: str | os.PathLike) -> bool:
    """True for URLs that are not local files (``s3://``, ``https://``...)."""
    return scheme_of(location) not in _LOCAL_SCHEMES


def local_path(location: str | os.PathLike) -> Path:
    """The path of a plain path or ``file://`` URL."""
    text = os.fspath(location)
    return Path(text[len("file://"):] if scheme_of(text) == "file" else text)


def base_name(location: str | os.PathLike) -> str:
    """The last path component (``shard-000001.tar``), for names in errors and fingerprints."""
    return os.fspath(location).rstrip("/").rsplit("/", 1)[-1]


@dataclass(frozen=True)
class RetryPolicy:
    """How long to keep retrying a failing read: backoff from `initial` doubling up to
    `maximum` seconds between tries, until `deadline` seconds after the endpoint started
    failing (one clock per process and endpoint, shared by all reads in flight).
    `request_timeout` bounds one request, so a server that accepts a connection and never
    answers counts as a failure (and is retried) instead of hanging the reader.
    Never part of a fingerprint: retries change when a batch comes, not what it holds."""

    deadline: float = setting(120.0, unit="seconds", help="keep retrying a failing read "
                              "from a URL this long, then stop naming the shard and offset "
                              "(never a skipped sample)")
    initial: float = setting(0.2, unit="seconds", help="the first pause between tries")
    maximum: float = setting(10.0, unit="seconds", help="the longest pause between tries")
    request_timeout: float = setting(60.0, unit="seconds", help="the longest one request "
                                     "may take before it counts as a failure")


@dataclass(frozen=True)
class Coalesce:
    """How a group's samples from one remote shard are merged into range requests.

    Samples of one shard whose byte ranges are at most `max_gap` bytes apart are
    fetched with one request of at most `max_bytes` (0: one request per sample).
    Remote requests cost milliseconds each, so reading a small gap is cheaper
    than a second request; local files (``pread``) are never coalesced.
    """

    max_bytes: int = setting(8 << 20, unit="bytes", help="largest range request that merges "
                             "neighbouring samples of one remote shard (0: one request per "
                             "sample)")
    max_gap: int = setting(1 << 20, unit="bytes", help="samples at most this far apart "
                           "share a range request")


@dataclass(frozen=True)
class StorageSettings:
    """The storage half of `Execution`, as installed for a thread (`storage_settings`)."""

    retry: RetryPolicy = field(default_factory=RetryPolicy)
    coalesce: Coalesce = field(default_factory=Coalesce)


DEFAULT_STORAGE = StorageSettings()
_installed = threading.local()


def current_storage() -> StorageSettings:
    """The settings installed for this thread, else the defaults."""
    stack = getattr(_installed, "stack", None)
    return stack[-1] if stack else DEFAULT_STORAGE


@contextmanager
def storage_settings(settings: StorageSettings | None) -> Iterator[None]:
    """Install `settings` for this thread for the duration (None: leave as is)."""
    if settings is None:
        yield
        return
    stack = _installed.__dict__.setdefault("stack", [])
    stack.append(settings)
    try:
        yield
    finally:
        stack.pop()


@dataclass(frozen=True, slots=True)
class FileStat:
    """What identifies one version of a shard: its byte size and `identity`."""

    size: int
    identity: str


class StoredFile(Protocol):
    """An open shard: random reads at byte offsets."""

    location: str
    size: int
    identity: str

    def read_at(self, offset: int, length: int) -> bytes: ...

    def close(self) -> None: ...


def _missing(location: str) -> BadSampleError:
    return BadSampleError("missing_shard", base_name(location), f"{location} does not exist")


class LocalFile:
    """A local shard read with ``pread`` (thread-safe, no shared file position)."""

    def __init__(self, location: str | os.PathLike) -> None:
        self.location = os.fspath(location)
        try:
            self._fd = os.open(local_path(location), os.O_RDONLY | getattr(os, "O_BINARY", 0))
        except FileNotFoundError:
            raise _missing(self.location) from None
        st = os.fstat(self._fd)
        self.size = st.st_size
        self.identity = f"mtime_ns:{st.st_mtime_ns}"
        self._lock = threading.Lock() if not hasattr(os, "pread") else None

    def read_at(self, offset: int, length: int) -> bytes:
        if self._lock is None:
            return os.pread(self._fd, length, offset)
        with self._lock:  # pragma: no cover - Windows has no pread
            os.lseek(self._fd, offset, os.SEEK_SET)
            return os.read(self._fd, length)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def forget(self) -> None:
        """In a forked child: drop the parent's descriptor without touching shared state."""
        self.close()


def stat_shard(location: str | os.PathLike, retry: RetryPolicy | None = None) -> FileStat:
    """Size and identity of a shard without opening it for reading.

    `retry` applies to URLs only (None: the thread's `current_storage()`).
    """
    if is_remote(location):
        from zephon_core.data.remote import remote_stat

        return remote_stat(os.fspath(location), retry)
    try:
        st = local_path(location).stat()
    except FileNotFoundError:
        raise _missing(os.fspath(location)) from None
    return FileStat(st.st_size, f"mtime_ns:{st.st_mtime_ns}")


def open_shard(location: str | os.PathLike, retry: RetryPolicy | None = None) -> StoredFile:
    """A `StoredFile` for a path or URL (see the module docstring); `retry` as `stat_shard`."""
    if is_remote(location):
        from zephon_core.data.remote import RemoteFile

        return RemoteFile(os.fspath(location), retry)
    return LocalFile(location)


def read_whole(location: str | os.PathLike, retry: RetryPolicy | None = None) -> bytes:
    """All bytes of a small file (a manifest, a sidecar index) at a path or URL.

    A missing local file raises `FileNotFoundError`, so callers can say how to
    make it; `retry` as `stat_shard`.
    """
    if not is_remote(location):
        return local_path(location).read_bytes()
    stored = open_shard(location, retry)
    try:
        return stored.read_at(0, stored.size)
    finally:
        stored.close()


class StoredFileIO:
    """A read-only, seekable file object over a `StoredFile` (for ``tarfile`` and hashing).

    Reads ahead `chunk` bytes so that a scan of consecutive headers costs one
    storage request per chunk, not one per header.
    """

    def __init__(self, stored: StoredFile, chunk: int = 1 << 20) -> None:
        self.stored = stored
        self.chunk = chunk
        self.pos = 0
        self._buf = b""
        self._buf_start = 0

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self.pos, 2: self.stored.size}[whence]
        self.pos = base + offset
        return self.pos

    def tell(self) -> int:
        return self.pos

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            n = max(0, self.stored.size - self.pos)
        start = self.pos - self._buf_start
        if 0 <= start and start + n <= len(self._buf):
            out = self._buf[start:start + n]
        elif n >= self.chunk:
            out = self.stored.read_at(self.pos, n)
        else:
            self._buf = self.stored.read_at(self.pos, max(n, self.chunk))
            self._buf_start = self.pos
            out = self._buf[:n]
        self.pos += len(out)
        return out
