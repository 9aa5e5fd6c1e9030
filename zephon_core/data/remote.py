"""Shards on object storage and web servers, through fsspec, with retries that never skip data.

A `RemoteFile` reads byte ranges (``cat_file(path, start, end)``): no
download of whole shards. The filesystem object comes from fsspec's instance
cache, so each process (worker) reuses one client and its connection pool for
every shard of a scheme; fsspec drops the cache in a forked child, which
then opens its own connections.

Transient failures (connection refused or reset, timeouts, 5xx) are retried
with exponential backoff until `RetryPolicy.deadline` seconds have passed
since the first failure; then a `StorageError` stops the run naming the shard,
the offset and the cause. An I/O failure is never a drop: a drop caused by the
network would differ between runs. A missing object is ``missing_shard``, as
for a local file.

Credentials and endpoints are whatever the filesystem reads from its standard
configuration (for S3: ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
``AWS_ENDPOINT_URL``, ``~/.aws``...); this module never sees them, and the
URLs it names in errors are those the user gave.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from zephon_core.data.storage import FileStat, base_name
from zephon_core.errors import BadSampleError, ConfigError, ZephonError

log = logging.getLogger(__name__)
T = TypeVar("T")


class StorageError(ZephonError):
    """Storage stayed unreachable past the retry deadline; the run stops (never a drop)."""


@dataclass(frozen=True)
class RetryPolicy:
    """How long to keep retrying a failing read: backoff from `initial` doubling up to
    `maximum` seconds between tries, until `deadline` seconds after the first failure.
    Never part of a fingerprint: retries change when a batch comes, not what it holds."""

    deadline: float = 120.0
    initial: float = 0.2
    maximum: float = 10.0


DEFAULT_RETRY = RetryPolicy()


def _fsspec():
    try:
        import fsspec
    except ImportError:
        raise ConfigError("reading shards from URLs needs fsspec: pip install "
                          "'zephon-vl[remote]' (fsspec, s3fs)") from None
    return fsspec


def _is_missing(exc: BaseException) -> bool:
    return isinstance(exc, FileNotFoundError)


def _is_permanent(exc: BaseException) -> bool:
    """Errors that retrying cannot fix: refused credentials, bad requests."""
    return isinstance(exc, (PermissionError, ValueError, TypeError, NotImplementedError))


def with_retries(what: Callable[[], T], policy: RetryPolicy, location: str,
                 offset: int | None) -> T:
    """`what()`, retried on transient errors (module docstring)."""
    start = None
    delay = policy.initial
    while True:
        try:
            return what()
        except Exception as exc:  # noqa: BLE001 - classified below
            if _is_missing(exc):
                raise BadSampleError("missing_shard", base_name(location),
                                     f"{location} does not exist") from None
            where = f"{location}" + (f" at offset {offset}" if offset is not None else "")
            cause = f"{type(exc).__name__}: {exc}"
            if _is_permanent(exc):
                raise StorageError(f"cannot read {where}: {cause}. Check the URL and the "
                                   "storage credentials/configuration.") from exc
            now = time.monotonic()
            start = now if start is None else start
            if now - start >= policy.deadline:
                raise StorageError(
                    f"cannot read {where}: still failing after {now - start:.1f} s of retries "
                    f"(deadline {policy.deadline} s); last error {cause}. The run stops "
                    "rather than skip data: fix the storage, then resume from the last "
                    "checkpoint (or raise RetryPolicy.deadline).") from exc
            log.warning("reading %s failed (%s); retrying in %.1f s", where, cause, delay)
            time.sleep(min(delay, max(0.0, policy.deadline - (now - start))))
            delay = min(delay * 2, policy.maximum)


#: Per-scheme client options: retrying is this module's job (one deadline for every
#: scheme), so the client's own retry loop is cut short; botocore would otherwise try
#: each request about 25 times over ~9 s before we see the failure.
_CLIENT_OPTIONS: dict[str, dict] = {
    "s3": {"config_kwargs": {"retries": {"max_attempts": 1}}},
}


def _filesystem(location: str):
    scheme = location.partition("://")[0].lower()
    fs, path = _fsspec().core.url_to_fs(location, **_CLIENT_OPTIONS.get(scheme, {}))
    if scheme == "s3":
        fs.retries = 1
    return fs, path


def _identity(info: dict) -> str:
    for key in ("ETag", "etag", "ETAG"):
        if info.get(key):
            return f"etag:{str(info[key]).strip(chr(34))}"
    for key in ("LastModified", "last_modified", "mtime", "updated"):
        if info.get(key):
            return f"mtime:{info[key]}"
    return "unknown"


def remote_stat(location: str, policy: RetryPolicy = DEFAULT_RETRY) -> FileStat:
    """Size and ETag (or modification time) of an object, fresh from the server."""
    fs, path = _filesystem(location)

    def info() -> dict:
        fs.invalidate_cache(path)
        return fs.info(path)

    found = with_retries(info, policy, location, None)
    return FileStat(int(found["size"]), _identity(found))


class RemoteFile:
    """A shard behind a URL, read by byte range (the `StoredFile` protocol)."""

    def __init__(self, location: str, policy: RetryPolicy = DEFAULT_RETRY) -> None:
        self.location = location
        self.policy = policy
        self._fs, self._path = _filesystem(location)
        st = remote_stat(location, policy)
        self.size, self.identity = st.size, st.identity

    def read_at(self, offset: int, length: int) -> bytes:
        end = min(offset + length, self.size)
        if end <= offset:
            return b""
        return with_retries(lambda: self._fs.cat_file(self._path, start=offset, end=end),
                            self.policy, self.location, offset)

    def close(self) -> None:
        """Nothing to close: the filesystem's connection pool is shared by the process."""

    def forget(self) -> None:
        """In a forked child: nothing inherited needs closing (fsspec starts a new client)."""
