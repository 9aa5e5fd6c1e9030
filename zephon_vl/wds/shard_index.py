"""Index one WebDataset tar shard: scan it, hash it, cache the index as a sidecar.

See `zephon_vl.wds.index` for the whole story (damaged tars, the index file);
`zephon_vl.wds.reader` reads samples through these indexes.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zephon_core import ZephonError
from zephon_core.extend import (
    StoredFile,
    StoredFileIO,
    atomic_write,
    base_name,
    is_remote,
    local_path,
    open_shard,
    read_whole,
    stat_shard,
)
from zephon_core.extend import cache_dir as default_cache_dir
from zephon_vl.wds.tarscan import Member, scan_tar

log = logging.getLogger(__name__)

INDEX_FORMAT = "zephon-wds-index"
INDEX_VERSION = 2
INDEX_SUFFIX = ".zidx.json"
_HASH_CHUNK = 8 << 20


@dataclass(slots=True)
class ShardIndex:
    """Where every sample of one shard lies, and which entries are known bad."""

    name: str
    size: int
    identity: str
    sha256: str | None
    keys: list[str]
    members: list[tuple[Member, ...]]
    bad: dict[int, tuple[str, str]]

    def __len__(self) -> int:
        return len(self.keys)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": INDEX_FORMAT,
            "version": INDEX_VERSION,
            "shard": self.name,
            "size": self.size,
            "identity": self.identity,
            "sha256": self.sha256,
            "samples": [
                [k, [list(m) for m in ms]] for k, ms in zip(self.keys, self.members, strict=True)
            ],
            "bad": [[i, r, d] for i, (r, d) in sorted(self.bad.items())],
        }

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> ShardIndex:
        if obj.get("format") != INDEX_FORMAT or obj.get("version") != INDEX_VERSION:
            raise ValueError("not a zephon wds index of this version")
        samples = obj["samples"]
        return cls(
            name=obj["shard"],
            size=int(obj["size"]),
            identity=str(obj["identity"]),
            sha256=obj.get("sha256"),
            keys=[s[0] for s in samples],
            members=[tuple((e, int(o), int(n)) for e, o, n in s[1]) for s in samples],
            bad={int(i): (r, d) for i, r, d in obj["bad"]},
        )


def content_sha256(stored: StoredFile) -> str:
    """SHA-256 of a shard's bytes, read sequentially in large chunks."""
    h = hashlib.sha256()
    for offset in range(0, stored.size, _HASH_CHUNK):
        data = stored.read_at(offset, min(_HASH_CHUNK, stored.size - offset))
        h.update(data)
    return h.hexdigest()


def scan_shard(path: str | Path, content_hash: bool = True, retry: Any = None) -> ShardIndex:
    """Index one tar shard from its headers (and hash its bytes when `content_hash`).

    A tar cut short (copy interrupted, disk full) keeps its complete samples;
    the last one is marked ``truncated_member``. Damaged headers are skipped
    and recorded (module docstring). A file that is not a tar raises
    ``ZephonError``. `retry`: a `zephon_core.data.remote.RetryPolicy` for URLs.
    """
    location = os.fspath(path)
    name = base_name(location)
    stored = open_shard(location, retry)
    try:
        if stored.size == 0:
            raise ZephonError(
                f"cannot index {location}: the file is empty (0 bytes), e.g. a copy that was "
                "interrupted; copy it again, or leave it out of the dataset"
            )
        if stored.read_at(0, 2) == b"\x1f\x8b":
            raise ZephonError(
                f"cannot index {location}: it is gzip-compressed, and compressed shards cannot "
                "be read at random offsets. Decompress it (gunzip, keep the .tar name) first."
            )
        samples = scan_tar(StoredFileIO(stored), stored.size, name, location)
        digest = content_sha256(stored) if content_hash else None
        size, identity = stored.size, stored.identity
    finally:
        stored.close()
    if not samples.keys:
        log.warning("%s: a tar without samples (%d bytes)", location, size)
    if samples.bad:
        first = [f"{samples.keys[i]}: {r}" for i, (r, _) in sorted(samples.bad.items())[:3]]
        log.warning("%s: %d unreadable sample(s), e.g. %s", location, len(samples.bad), first)
    return ShardIndex(
        name=name,
        size=size,
        identity=identity,
        sha256=digest,
        keys=samples.keys,
        members=[tuple(ms) for ms in samples.members],
        bad=samples.bad,
    )


def _cache_paths(location: str | Path, cache_dir: Path | None) -> list[Path]:
    """Where to look for the index, in order; the first is where it is written.

    Local shards keep it beside the file (or in `cache_dir`); remote shards in
    `cache_dir` or zephon's cache folder, under a hash of the URL (the URL
    itself is never written into a file name).
    """
    name = base_name(location)
    if is_remote(location):
        digest = hashlib.sha256(os.fspath(location).encode()).hexdigest()[:16]
        folder = cache_dir if cache_dir is not None else default_cache_dir() / "wds-index"
        return [folder / f"{name}.{digest}{INDEX_SUFFIX}"]
    shard = local_path(location)
    beside = shard.with_name(shard.name + INDEX_SUFFIX)
    if cache_dir is None:
        return [beside]
    digest = hashlib.sha256(str(shard.resolve()).encode()).hexdigest()[:16]
    return [cache_dir / f"{shard.name}.{digest}{INDEX_SUFFIX}", beside]


def read_index_file(path: str | Path, retry: Any = None) -> ShardIndex:
    """A sidecar index from a local path or URL (raises OSError/ValueError when unusable)."""
    return ShardIndex.from_json(json.loads(read_whole(path, retry)))


def load_index(shard: str | Path, cache_dir: str | Path | None = None,
               content_hash: bool = True, retry: Any = None) -> ShardIndex:
    """The index of `shard`, from its cache when size and identity still match, else rebuilt."""
    cdir = Path(cache_dir) if cache_dir is not None else None
    st = stat_shard(shard, retry)
    paths = _cache_paths(shard, cdir)
    for p in paths:
        try:
            idx = read_index_file(p)
        except FileNotFoundError:
            continue
        except (OSError, ValueError, KeyError, TypeError, IndexError) as e:
            log.info("ignoring unusable index %s (%s); rebuilding", p, e)
            continue
        if (idx.size, idx.identity) == (st.size, st.identity) and \
                (idx.sha256 is not None or not content_hash):
            return idx
        log.info("%s changed since it was indexed; rebuilding its index", shard)
    options: dict[str, Any] = {}
    if not content_hash:
        options["content_hash"] = False
    if retry is not None:
        options["retry"] = retry
    idx = scan_shard(shard, **options)
    try:
        atomic_write(paths[0], json.dumps(idx.to_json(), separators=(",", ":")))
    except OSError as e:
        log.warning(
            "cannot write index cache %s (%s); the index lives in memory only. "
            "Pass cache_dir= to WebDatasetReader for read-only shard folders.",
            paths[0],
            e,
        )
    return idx


def shard_changed_error(name: str, field: str, indexed: Any, now: Any) -> ZephonError:
    """The refusal for a shard whose bytes are not those its index describes."""
    return ZephonError(
        f"shard {name} changed since it was indexed: {field} was {indexed}, is now {now}. "
        "Its sample offsets no longer apply. Re-index it (from a manifest: zephon-vl index "
        "--refresh MANIFEST; else delete its .zidx.json) and start the run again; a "
        "checkpoint of the old data will be refused.")

