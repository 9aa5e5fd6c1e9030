"""Random access into WebDataset tar shards by ``(shard, index)``.

WebDataset is a streaming format; zephon needs pointers (``(dataset, shard,
index)``) so that shuffling, lanes and resume are decided without I/O. This
module scans each tar's headers once (``tarfile``, no member data parsed),
groups members into samples with WebDataset's own key rule, hashes the shard's
bytes (SHA-256, so a same-size edit changes the checkpoint fingerprint), and
caches the result as a JSON sidecar keyed by the shard's size and identity
(mtime, or ETag for objects), so a changed shard is noticed and re-indexed.
Reads are ``read_at`` calls at recorded offsets through
`zephon_core.data.storage` (``pread`` for local files, range requests for
URLs): no scanning and no parsing per sample.

Damaged tar structure never hides samples. When a header cannot be read (bad
checksum, a flipped bit in a name, a non-octal or absurd size, a directory
typeflag on a member with data, a zeroed header block), the scan steps forward
in 512-byte blocks to the next valid header and carries on. The unreadable
bytes become an index entry of their own (key ``damaged@START-END``) that
carries the error, and the samples on either side (which may have lost a
member to the damage) are marked too; each becomes a ``damaged_tar`` drop
naming the shard and byte range when its pointer is drawn (or stops the run
under ``on_error="raise"``). The count of entries depends only on the bytes,
so it stays deterministic.

Index file (``<shard>.zidx.json`` beside a local shard, or
``<cache_dir>/<shard>.<location hash>.zidx.json``)::

    {"format": "zephon-wds-index", "version": 2, "shard": "shard-000000.tar",
     "size": 1234567, "identity": "mtime_ns:1700000000000000000",
     "sha256": "9f2c...", "samples": [["000123", [["jpg", 1536, 40211], ...]], ...],
     "bad": [[249, "truncated_member", "jpg needs bytes up to 1234999 ..."]]}

``samples`` is in tar order; each member is ``[extension, data offset, size]``.
``bad`` lists entries that are indexed but cannot be read.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zephon_core import BadSampleError, ZephonError
from zephon_core.extend import (
    StoredFile,
    StoredFileIO,
    atomic_write,
    base_name,
    current_storage,
    is_remote,
    local_path,
    open_shard,
    read_whole,
    stat_shard,
)
from zephon_core.extend import cache_dir as default_cache_dir
from zephon_vl.wds.tarscan import DAMAGED, Member, scan_tar  # noqa: F401  (DAMAGED: the drop reason)

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


class _OpenShards:
    """Per-process, bounded set of open shards (`StoredFile`s).

    Bounded because a shuffled read over thousands of shards would hit the
    open-file limit; reference counts keep a shard open while a thread reads it.
    """

    def __init__(self, max_open: int) -> None:
        self.max_open = max_open
        self.lock = threading.Lock()
        self.files: OrderedDict[int, list[Any]] = OrderedDict()  # shard -> [file, users]

    def acquire(self, s: int, location: str | Path, idx: ShardIndex) -> StoredFile:
        with self.lock:
            entry = self.files.get(s)
            if entry is not None:
                self.files.move_to_end(s)
                entry[1] += 1
                return entry[0]
        stored = open_shard(location)
        for field, indexed, now in (("size", idx.size, stored.size),
                                    ("identity", idx.identity, stored.identity)):
            if indexed != now:
                stored.close()
                raise shard_changed_error(idx.name, field, indexed, now)
        with self.lock:
            entry = self.files.get(s)
            if entry is not None:  # another thread opened it meanwhile
                stored.close()
                entry[1] += 1
            else:
                entry = self.files[s] = [stored, 1]
                self._evict()
            return entry[0]

    def release(self, s: int) -> None:
        with self.lock:
            self.files[s][1] -= 1

    def __len__(self) -> int:
        return len(self.files)

    def _evict(self) -> None:
        if len(self.files) <= self.max_open:
            return
        for s in [s for s, (_, users) in self.files.items() if users == 0]:
            self.files.pop(s)[0].close()
            if len(self.files) <= self.max_open:
                return

    def close(self) -> None:
        with self.lock:
            for stored, _ in self.files.values():
                stored.close()
            self.files.clear()

    def forget(self) -> None:
        """In a forked child: drop the inherited handles without the (maybe held) lock."""
        for stored, _ in self.files.values():
            try:
                getattr(stored, "forget", stored.close)()
            except OSError:
                pass
        self.files.clear()


@dataclass(frozen=True, slots=True)
class ShardEntry:
    """One shard as a manifest records it: enough to plan and fingerprint without its bytes."""

    url: str
    size: int
    identity: str
    num_samples: int
    sha256: str | None
    index: str  # where its sidecar index lies (path or URL)


class WebDatasetReader:
    """Reads samples of WebDataset shards (paths or URLs) by ``(shard, index)``.

    Shard lengths are lazy: a shard is indexed (or its cached sidecar read) the
    first time its length or samples are asked for. Given manifest `entries`
    (`zephon_vl.wds.manifest`), lengths and fingerprints come from them and a
    shard's sidecar is read only when a sample of it is, so building a Loader
    opens no shard at all. With `content_hash` (the default) the index holds a
    SHA-256 of the shard's bytes, which the checkpoint fingerprint carries.
    How reads from URLs are retried and coalesced is the Execution's
    (`Execution.retry`, `Execution.coalesce`), never the reader's.

    Picklable: the indexes loaded so far travel with it (so workers see exactly
    the samples the parent counted), open shards do not. Each process opens
    its own on first use, including after a fork.
    """

    def __init__(
        self,
        shards: list[str | Path],
        cache_dir: str | Path | None = None,
        max_open_files: int = 128,
        content_hash: bool = True,
        entries: list[ShardEntry] | None = None,
    ) -> None:
        self.shards: list[str | Path] = [
            os.fspath(s) if is_remote(s) else local_path(s) for s in shards]
        if entries is not None and len(entries) != len(self.shards):
            raise ValueError(f"{len(entries)} manifest entries for {len(self.shards)} shards")
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None
        self.max_open_files = max_open_files
        self.content_hash = content_hash
        self.entries = entries
        self._indexes: list[ShardIndex | None] = [None] * len(self.shards)
        self._init_runtime()

    def _init_runtime(self) -> None:
        self._pid = os.getpid()
        self._load_lock = threading.Lock()
        self._open = _OpenShards(self.max_open_files)

    def _after_fork(self) -> None:
        """Handles and locks inherited through fork belong to the parent: start afresh."""
        self._open.forget()
        self._init_runtime()

    def __getstate__(self) -> dict[str, Any]:
        return {
            "shards": self.shards,
            "cache_dir": self.cache_dir,
            "max_open_files": self.max_open_files,
            "content_hash": self.content_hash,
            "entries": self.entries,
            "indexes": self._indexes,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.shards = state["shards"]
        self.cache_dir = state["cache_dir"]
        self.max_open_files = state["max_open_files"]
        self.content_hash = state["content_hash"]
        self.entries = state["entries"]
        self._indexes = state["indexes"]
        self._init_runtime()

    @property
    def num_shards(self) -> int:
        return len(self.shards)

    def open_shards(self) -> int:
        """How many shards this process holds open now (bounded by `max_open_files`)."""
        return len(self._open)

    def index(self, s: int) -> ShardIndex:
        """The index of shard `s`, loaded (or built) on first use."""
        idx = self._indexes[s]
        if idx is None:
            if self._pid != os.getpid():
                self._after_fork()
            with self._load_lock:
                idx = self._indexes[s]
                if idx is None:
                    idx = self._indexes[s] = self._load(s)
        return idx

    def _load(self, s: int) -> ShardIndex:
        if self.entries is None:
            return load_index(self.shards[s], self.cache_dir, self.content_hash)
        entry = self.entries[s]
        try:
            idx = read_index_file(entry.index)
        except (OSError, ValueError, KeyError, TypeError, IndexError) as e:
            raise ZephonError(f"cannot read the index {entry.index} of shard "
                              f"{base_name(entry.url)} named by the manifest ({e}); "
                              "re-create the manifest with zephon-vl index") from None
        for field, want, got in (("size", entry.size, idx.size),
                                 ("identity", entry.identity, idx.identity),
                                 ("num_samples", entry.num_samples, len(idx)),
                                 ("sha256", entry.sha256, idx.sha256)):
            if want != got:
                raise ZephonError(f"the index {entry.index} does not match the manifest entry "
                                  f"of shard {base_name(entry.url)}: {field} {got} != {want}; "
                                  "re-create the manifest with zephon-vl index")
        return idx

    def shard_len(self, s: int) -> int:
        if self.entries is not None:
            return self.entries[s].num_samples
        return len(self.index(s))

    def shard_lengths(self) -> list[int]:
        """Every shard's sample count (from the manifest when there is one)."""
        return [self.shard_len(s) for s in range(self.num_shards)]

    def shard_identity(self, s: int) -> dict[str, Any]:
        """What a checkpoint fingerprint records about shard `s`: name, size, count and
        content hash (not the storage `identity`: copies of the same bytes differ in mtime)."""
        if self.entries is not None:
            e = self.entries[s]
            name, size, samples, sha256 = base_name(e.url), e.size, e.num_samples, e.sha256
        else:
            idx = self.index(s)
            name, size, samples, sha256 = idx.name, idx.size, len(idx), idx.sha256
        return {"name": name, "size": size, "num_samples": samples, "sha256": sha256}

    def key(self, s: int, i: int) -> str:
        return self.index(s).keys[i]

    def read(self, s: int, i: int) -> dict[str, bytes | str]:
        """Raw bytes of sample `i` of shard `s` by extension; ``__key__``, ``__shard__`` are str.

        The members of a sample are contiguous in the tar, so they come in one read.
        """
        idx, out, span = self._prepare(s, i)
        if span is not None:
            self._fill(idx, i, out, self._fetch(s, idx, i, *span), span[0])
        return out

    def read_many(self, pointers: Sequence[tuple[int, int]]) -> list[dict[str, bytes | str]]:
        """`read` of each ``(shard, index)``, in order; samples of one remote shard whose
        bytes lie close together come in one range request.

        Within the thread's `current_storage().coalesce` bounds (set by
        `Execution.coalesce`): ranges at most ``max_gap`` bytes apart merge into
        one request of at most ``max_bytes``. Local shards are read sample by
        sample (``pread`` costs microseconds). The bytes are the same either way.
        """
        co = current_storage().coalesce
        out: list[Any] = [None] * len(pointers)
        by_shard: dict[int, list[tuple[int, int, int, int]]] = {}
        for j, (s, i) in enumerate(pointers):
            idx, sample, span = self._prepare(s, i)
            out[j] = sample
            if span is None:
                continue
            if co.max_bytes <= 0 or not is_remote(self.shards[s]):
                self._fill(idx, i, sample, self._fetch(s, idx, i, *span), span[0])
            else:
                by_shard.setdefault(s, []).append((span[0], span[1], j, i))
        for s, spans in by_shard.items():
            spans.sort()
            run = [spans[0]]
            for span in spans[1:]:
                lo, hi = run[0][0], max(r[1] for r in run)
                if span[0] - hi <= co.max_gap and max(hi, span[1]) - lo <= co.max_bytes:
                    run.append(span)
                else:
                    self._read_run(s, run, out)
                    run = [span]
            self._read_run(s, run, out)
        return out

    def _read_run(self, s: int, run: list[tuple[int, int, int, int]], out: list[Any]) -> None:
        """One request for a run of samples of shard `s` (`read_many`)."""
        idx = self.index(s)
        lo, hi = run[0][0], max(r[1] for r in run)
        data = self._fetch(s, idx, run[0][3], lo, hi)
        for _, _, j, i in run:
            self._fill(idx, i, out[j], data, lo)

    def _prepare(self, s: int, i: int) -> tuple[ShardIndex, dict[str, Any], tuple | None]:
        """Checks before a read: the index, the sample's header fields and its byte span
        (None when it has no members)."""
        idx = self._indexes[s] or self.index(s)
        if not 0 <= i < len(idx.keys):
            raise IndexError(f"sample {i} out of range for {idx.name} ({len(idx.keys)} samples)")
        key = idx.keys[i]
        if idx.bad and i in idx.bad:
            reason, detail = idx.bad[i]
            raise BadSampleError(reason, f"{idx.name}:{key}", detail)
        if self._pid != os.getpid():
            self._after_fork()
        members = idx.members[i]
        out: dict[str, Any] = {"__key__": key, "__shard__": idx.name}
        if not members:
            return idx, out, None
        return idx, out, (min(o for _, o, _ in members), max(o + n for _, o, n in members))

    def _fetch(self, s: int, idx: ShardIndex, i: int, start: int, stop: int) -> bytes:
        try:
            stored = self._open.acquire(s, self.shards[s], idx)
        except BadSampleError as e:
            raise BadSampleError(e.reason, f"{idx.name}:{idx.keys[i]}", e.detail) from None
        try:
            return stored.read_at(start, stop - start)
        finally:
            self._open.release(s)

    @staticmethod
    def _fill(idx: ShardIndex, i: int, out: dict[str, Any], data: bytes, base: int) -> None:
        """Cut sample `i`'s members out of `data`, which holds the shard's bytes from `base`."""
        for ext, offset, size in idx.members[i]:
            if offset + size - base > len(data):
                raise BadSampleError(
                    "truncated_member",
                    f"{idx.name}:{idx.keys[i]}",
                    f"{ext}: read {max(0, len(data) - (offset - base))} of {size} bytes at "
                    f"offset {offset}; the shard is shorter than when it was indexed",
                )
            out[ext] = data[offset - base:offset - base + size]

    def close(self) -> None:
        """Close this process's open shards (they reopen on the next read)."""
        if self._pid == os.getpid():
            self._open.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass
