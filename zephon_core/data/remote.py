"""Shards on object storage and web servers, through fsspec, with retries that never skip data.

A `RemoteFile` reads byte ranges (``cat_file(path, start, end)``): no
download of whole shards. The filesystem object comes from fsspec's instance
cache, so each process (worker) reuses one client and its connection pool for
every shard of a scheme; fsspec drops the cache in a forked child, which
then opens its own connections.

Transient failures (connection refused or reset, timeouts, 5xx) are retried
with exponential backoff until `RetryPolicy.deadline` seconds have passed
since the endpoint started failing (one clock per process and endpoint, shared
by every read in flight); then a `StorageError` stops the run naming the shard,
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
import os
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from zephon_core.data.locations import FileStat, base_name
from zephon_core.data.storage_settings import RetryPolicy, current_storage
from zephon_core.errors import BadSampleError, ConfigError, ZephonError

log = logging.getLogger(__name__)
T = TypeVar("T")


class StorageError(ZephonError):
    """Storage stayed unreachable past the retry deadline; the run stops (never a drop)."""


__all__ = ["RemoteFile", "RetryPolicy", "StorageError", "remote_stat",
           "with_retries"]


def _fsspec():
    try:
        import fsspec
    except ImportError:
        raise ConfigError("reading shards from URLs needs fsspec: pip install "
                          "'zephon-vl[remote]' (fsspec, s3fs)") from None
    return fsspec


def _is_missing(exc: BaseException) -> bool:
    return isinstance(exc, FileNotFoundError)


def _unwrapped(exc: BaseException) -> BaseException:
    """The error that decides what to do. fsspec's HTTP filesystem reports *any* failed
    ``info`` (connection refused, a timeout, a 503) as FileNotFoundError raised from the
    real cause; only a 404/410 (or a FileNotFoundError without a cause) means missing."""
    cause = exc.__cause__
    if isinstance(exc, FileNotFoundError) and cause is not None and \
            not isinstance(cause, FileNotFoundError) and \
            getattr(cause, "status", None) not in (404, 410):
        return cause
    return exc


def _http_status(exc: BaseException) -> int | None:
    """The HTTP status an error carries: aiohttp's ``status``, gcsfs's ``HttpError.code``."""
    for attr in ("status", "code"):
        value = getattr(exc, attr, None)
        if isinstance(value, int):
            return value
    return None


def _is_permanent(exc: BaseException) -> bool:
    """Errors that retrying cannot fix: refused credentials, bad requests. s3fs says
    PermissionError; gcsfs says 403 with a plain ``OSError("Forbidden: ...")`` and 401 with
    an ``HttpError`` (it retries only an expired token itself), HTTP with a status."""
    if isinstance(exc, (PermissionError, ValueError, TypeError, NotImplementedError)):
        return True
    if type(exc) is OSError and str(exc).startswith("Forbidden"):
        return True
    return _http_status(exc) in (401, 403)


#: Per storage endpoint (scheme://host or bucket), in this process: when it started
#: failing and when it last failed; dropped as soon as it answers. Reads share the
#: outage's clock, so with many groups in flight the run stops one deadline after storage
#: went away, not one deadline per group.
_failing: dict[str, tuple[float, float]] = {}
_failing_lock = threading.Lock()


def _new_lock_in_child() -> None:
    """A forked worker may have been copied while a driver thread held the lock."""
    global _failing_lock
    _failing_lock = threading.Lock()


os.register_at_fork(after_in_child=_new_lock_in_child)


def _answered(endpoint: str) -> None:
    if endpoint in _failing:
        with _failing_lock:
            _failing.pop(endpoint, None)


def _outage_start(endpoint: str, policy: RetryPolicy, began: float) -> float:
    """When the endpoint's current outage began, for a read whose failing try was sent at
    `began`. The clock starts when the try was sent, not when its failure came back: a try
    may take a request timeout or more (fsspec's HTTP ``info`` sends two requests; gcsfs
    tries six times over ~31 s) before it fails. A try sent long after the last failure
    (nobody was retrying: more than one backoff step and request timeout) starts a new one."""
    now = time.monotonic()
    with _failing_lock:
        start, last = _failing.get(endpoint, (began, began))
        if began - last > policy.maximum + policy.request_timeout + 1.0:
            start = began
        start = min(start, began)
        _failing[endpoint] = (start, max(last, now))
    return start


def _endpoint(location: str) -> str:
    scheme, _, rest = location.partition("://")
    return f"{scheme.lower()}://{rest.split('/', 1)[0]}"


def with_retries(what: Callable[[], T], policy: RetryPolicy, location: str,
                 offset: int | None) -> T:
    """`what()`, retried on transient errors (module docstring)."""
    endpoint = _endpoint(location)
    delay = policy.initial
    while True:
        began = time.monotonic()
        try:
            out = what()
            _answered(endpoint)
            return out
        except Exception as raised:  # noqa: BLE001 - classified below
            exc = _unwrapped(raised)
            if _is_missing(exc) or _is_permanent(exc):
                _answered(endpoint)
            if _is_missing(exc):
                raise BadSampleError("missing_shard", base_name(location),
                                     f"{location} does not exist") from None
            where = f"{location}" + (f" at offset {offset}" if offset is not None else "")
            cause = f"{type(exc).__name__}: {exc}"
            if _is_permanent(exc):
                raise StorageError(f"cannot read {where}: {cause}. Check the URL and the "
                                   "storage credentials/configuration.") from exc
            start = _outage_start(endpoint, policy, began)
            now = time.monotonic()
            if now - start >= policy.deadline:
                raise StorageError(
                    f"cannot read {where}: still failing after {now - start:.1f} s of retries "
                    f"(deadline {policy.deadline} s); last error {cause}. The run stops "
                    "rather than skip data: fix the storage, then resume from the last "
                    "checkpoint (or raise Execution.retry.deadline, --retry-deadline).") from exc
            log.warning("reading %s failed (%s); retrying in %.1f s", where, cause, delay)
            time.sleep(min(delay, max(0.0, policy.deadline - (now - start))))
            delay = min(delay * 2, policy.maximum)


def _client_options(scheme: str, policy: RetryPolicy) -> dict[str, Any]:
    """Per-scheme client options. Retrying is this module's job (one deadline for every
    scheme), so the client's own retry loop is cut short where the client allows it
    (botocore would otherwise try each request about 25 times over ~9 s before we see the
    failure; gcsfs's six tries with ~31 s of backoff are fixed in its code), and every request
    gets `policy.request_timeout`, so a server that never answers is a failure, not a hang."""
    t = policy.request_timeout
    if scheme in ("s3", "s3a"):
        return {"config_kwargs": {"retries": {"max_attempts": 1}, "connect_timeout": t,
                                  "read_timeout": t}}
    if scheme in ("http", "https"):
        import aiohttp

        return {"client_kwargs": {"timeout": aiohttp.ClientTimeout(total=None, connect=t,
                                                                   sock_read=t)}}
    if scheme in ("gs", "gcs"):
        import aiohttp

        return {"requests_timeout": aiohttp.ClientTimeout(total=None, connect=t, sock_read=t)}
    return {}


def _filesystem(location: str, policy: RetryPolicy):
    """fsspec's filesystem for `location` (cached per process and options) and its path."""
    fsspec = _fsspec()
    scheme = location.partition("://")[0].lower()
    try:
        fs, path = fsspec.core.url_to_fs(location, **_client_options(scheme, policy))
    except ImportError as e:
        from fsspec.registry import known_implementations

        known = known_implementations.get(scheme, {})
        package = known.get("class", "?").split(".")[0]
        fix = f"pip install {package}" if package not in ("fsspec", "?") else \
            "pip install 'zephon-vl[remote]'"
        raise ConfigError(f"reading {scheme}:// URLs ({base_name(location)}) needs a package "
                          f"that is not installed: {known.get('err') or e}. Fix: {fix}") from None
    except ValueError as e:
        raise ConfigError(f"{location}: no filesystem for {scheme}:// ({e})") from None
    if scheme in ("s3", "s3a"):
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


def remote_stat(location: str, policy: RetryPolicy | None = None) -> FileStat:
    """Size and ETag (or modification time) of an object, fresh from the server
    (`policy` None: the thread's `current_storage().retry`)."""
    policy = policy or current_storage().retry
    fs, path = _filesystem(location, policy)

    def info() -> dict:
        fs.invalidate_cache(path)
        return fs.info(path)

    found = with_retries(info, policy, location, None)
    return FileStat(int(found["size"]), _identity(found))


class RemoteFile:
    """A shard behind a URL, read by byte range (the `StoredFile` protocol).

    With `policy` None, each read uses the policy installed for the calling
    thread (`current_storage()`), so one open handle serves every Loader.
    """

    def __init__(self, location: str, policy: RetryPolicy | None = None) -> None:
        self.location = location
        self.policy = policy
        self._client: tuple[RetryPolicy, Any, str] | None = None
        st = remote_stat(location, policy)
        self.size, self.identity = st.size, st.identity

    def read_at(self, offset: int, length: int) -> bytes:
        end = min(offset + length, self.size)
        if end <= offset:
            return b""
        policy = self.policy or current_storage().retry
        if self._client is None or self._client[0] != policy:
            self._client = (policy, *_filesystem(self.location, policy))
        _, fs, path = self._client
        return with_retries(lambda: fs.cat_file(path, start=offset, end=end),
                            policy, self.location, offset)

    def close(self) -> None:
        """Nothing to close: the filesystem's connection pool is shared by the process."""

    def forget(self) -> None:
        """In a forked child: drop the parent's client (fsspec starts a new one)."""
        self._client = None
