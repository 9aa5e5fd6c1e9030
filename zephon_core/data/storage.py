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

How to retry and how far to coalesce reads are execution settings, installed for
a thread (`storage_settings.py`); what a location names and `FileStat` are
`locations.py`. Both sit below this module and `remote.py`, which this module
imports only to open a URL.
"""

from __future__ import annotations

import os
import threading

from zephon_core.data.locations import (
    FileStat,
    StoredFile,
    base_name,
    is_remote,
    local_path,
    scheme_of,
)
from zephon_core.data.storage_settings import (
    Coalesce,
    RetryPolicy,
    StorageSettings,
    current_storage,
    storage_settings,
)
from zephon_core.errors import BadSampleError

#: the names this module has always offered (`zephon_core.__all__` and `zephon_core.extend`
#: resolve them here); they live in `locations.py` and `storage_settings.py`, below this
#: module and `remote.py`, so that the two do not import each other
__all__ = ["Coalesce", "FileStat", "LocalFile", "RetryPolicy", "StorageSettings", "StoredFile",
           "StoredFileIO", "base_name", "current_storage", "is_remote", "local_path",
           "open_shard", "read_whole", "scheme_of", "stat_shard", "storage_settings"]


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
