"""How remote reads are retried and coalesced: the storage half of `Execution`.

These are execution settings (`zephon_core.engine.execution.Execution.retry` and
``.coalesce``): they change when bytes arrive, never which. The engine installs
them for the thread that runs a stage or builds a Loader with `storage_settings`;
readers read them with `current_storage()`, so readers pickled into workers need
not carry them and no fingerprint sees them. Below `storage.py` and `remote.py`,
which both read them.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from zephon_core.common.settings import check_settings, setting


@dataclass(frozen=True)
class RetryPolicy:
    """How long to keep retrying a failing read: backoff from `initial` doubling up to
    `maximum` seconds between tries, until `deadline` seconds after the endpoint started
    failing (one clock per process and endpoint, shared by all reads in flight).
    `request_timeout` bounds one request, so a server that accepts a connection and never
    answers counts as a failure (and is retried) instead of hanging the reader.
    Never part of a fingerprint: retries change when a batch comes, not what it holds."""

    deadline: float = setting(120.0, unit="seconds", min=0, help="keep retrying a failing read "
                              "from a URL this long, then stop naming the shard and offset "
                              "(never a skipped sample)")
    initial: float = setting(0.2, unit="seconds", above=0,
                             help="the first pause between tries")
    maximum: float = setting(10.0, unit="seconds", above=0,
                             help="the longest pause between tries")
    request_timeout: float = setting(60.0, unit="seconds", above=0, help="the longest one "
                                     "request may take before it counts as a failure")

    def __post_init__(self) -> None:
        check_settings(self)


@dataclass(frozen=True)
class Coalesce:
    """How a group's samples from one remote shard are merged into range requests.

    Samples of one shard whose byte ranges are at most `max_gap` bytes apart are
    fetched with one request of at most `max_bytes` (0: one request per sample).
    Remote requests cost milliseconds each, so reading a small gap is cheaper
    than a second request; local files (``pread``) are never coalesced.
    """

    max_bytes: int = setting(8 << 20, unit="bytes", min=0, help="largest range request that merges "
                             "neighbouring samples of one remote shard (0: one request per "
                             "sample)")
    max_gap: int = setting(1 << 20, unit="bytes", min=0, help="samples at most this far "
                           "apart share a range request")

    def __post_init__(self) -> None:
        check_settings(self)


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
