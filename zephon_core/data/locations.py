"""Locations: what a path or URL names, and what identifies one version of its bytes.

The bottom of the storage seam: `storage.py` (opening shards) and `remote.py`
(object storage through fsspec) both read locations with these, and neither
is imported from here. A plain path or ``file://`` URL is local; any other URL
(``s3://``, ``gs://``, ``https://``...) is remote and never resolved as a local path.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

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

    def forget(self) -> None:
        """In a forked child: drop what the parent opened without touching what it shares
        (a lock another thread of the parent may have held at the fork)."""
        ...
