"""Random access into WebDataset tar shards by ``(shard, index)``.

WebDataset is a streaming format; zephon needs pointers (``(dataset, shard,
index)``) so that shuffling, lanes and resume are decided without I/O. This
module scans each tar's headers once (``tarfile``, no member data read), groups
members into samples with WebDataset's own key rule, and caches the result as a
JSON sidecar keyed by the shard's size and mtime, so a changed shard is noticed
and re-indexed. Reads are ``pread`` calls at recorded offsets: no scanning and
no parsing per sample.

Index file (``<shard>.zidx.json`` beside the shard, or
``<cache_dir>/<shard>.<path hash>.zidx.json``)::

    {"format": "zephon-wds-index", "version": 1, "shard": "shard-000000.tar",
     "size": 1234567, "mtime_ns": 1700000000000000000,
     "samples": [["000123", [["jpg", 1536, 40211], ["txt", 42496, 187]]], ...],
     "bad": [[249, "truncated_member", "jpg needs bytes up to 1234999 ..."]]}

``samples`` is in tar order; each member is ``[extension, data offset, size]``.
``bad`` lists samples that are indexed but cannot be read, so that one cut
sample is dropped with a reason instead of failing the whole shard.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import tarfile
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zephon_core import BadSampleError, ZephonError, atomic_write

log = logging.getLogger(__name__)

INDEX_FORMAT = "zephon-wds-index"
INDEX_VERSION = 1
INDEX_SUFFIX = ".zidx.json"
_BLOCK = tarfile.BLOCKSIZE

# WebDataset's rule (webdataset.tariterators.base_plus_ext): the key is the path up
# to the first dot of the basename, the extension is everything after it.
_KEY_EXT = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")
# WebDataset skips these metadata members entirely.
_SKIP_META = re.compile(r"__[^/]*__($|/)")

Member = tuple[str, int, int]  # (extension, data offset, size)


@dataclass(slots=True)
class ShardIndex:
    """Where every sample of one shard lies, and which samples are known bad."""

    name: str
    size: int
    mtime_ns: int
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
            "mtime_ns": self.mtime_ns,
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
            mtime_ns=int(obj["mtime_ns"]),
            keys=[s[0] for s in samples],
            members=[tuple((e, int(o), int(n)) for e, o, n in s[1]) for s in samples],
            bad={int(i): (r, d) for i, r, d in obj["bad"]},
        )


def scan_shard(path: str | Path) -> ShardIndex:
    """Index one tar shard from its headers only.

    A tar cut short (copy interrupted, disk full) keeps its complete samples;
    the last one is marked ``truncated_member`` because members of it may be
    missing or cut. A file that is not a readable tar raises ``ZephonError``.
    """
    path = Path(path)
    name = path.name
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        raise BadSampleError("missing_shard", name, f"{path} does not exist") from None
    with f:
        st = os.fstat(f.fileno())
        head = f.read(2)
        f.seek(0)
        if head == b"\x1f\x8b":
            raise ZephonError(
                f"cannot index {path}: it is gzip-compressed, and compressed shards cannot "
                "be read at random offsets. Decompress it (gunzip, keep the .tar name) first."
            )
        try:
            tf = tarfile.open(fileobj=f, mode="r:")
        except (tarfile.TarError, EOFError) as e:
            raise ZephonError(
                f"cannot index {path}: not a readable uncompressed tar ({e}). Check the file "
                "is a complete WebDataset shard, or re-create it with "
                "zephon_vl.wds.writer.write_shards."
            ) from None

        keys: list[str] = []
        members: list[list[Member]] = []
        bad: dict[int, tuple[str, str]] = {}
        while True:
            try:
                ti = tf.next()
            except (tarfile.TarError, EOFError):
                break  # data of the previous member runs past the end: marked below
            if ti is None:
                break
            tf.members.clear()  # tarfile keeps every TarInfo otherwise
            fname = ti.name
            if not ti.isreg() or ti.issparse():
                continue
            if "/" not in fname and fname.startswith("__") and fname.endswith("__"):
                continue
            if _SKIP_META.match(fname):
                continue
            m = _KEY_EXT.match(fname)
            if m is None:
                continue
            key, ext = m.group(1), m.group(2).lower()
            if not keys or keys[-1] != key:
                keys.append(key)
                members.append([])
            i = len(keys) - 1
            if any(e == ext for e, _, _ in members[i]):
                bad.setdefault(i, ("duplicate_member", f"{fname} appears twice in one sample"))
                continue
            members[i].append((ext, ti.offset_data, ti.size))
            end = ti.offset_data + ti.size
            if end > st.st_size:
                bad[i] = (
                    "truncated_member",
                    f"{ext} needs bytes up to {end} but the file has {st.st_size}",
                )

        # A complete tar ends with a zero block where the next header would be.
        f.seek(tf.offset)
        tail = f.read(_BLOCK)
        if keys and (len(tail) < _BLOCK or tail.count(0) != _BLOCK) and (len(keys) - 1) not in bad:
            what = "is cut" if len(tail) < _BLOCK else "has an unreadable header"
            bad[len(keys) - 1] = (
                "truncated_member",
                f"the archive {what} at byte {tf.offset} (file size {st.st_size}); "
                "the last sample may be incomplete",
            )
        if bad:
            first = [f"{keys[i]}: {r}" for i, (r, _) in sorted(bad.items())[:3]]
            log.warning("%s: %d unreadable sample(s), e.g. %s", path, len(bad), first)

    return ShardIndex(
        name=name,
        size=st.st_size,
        mtime_ns=st.st_mtime_ns,
        keys=keys,
        members=[tuple(ms) for ms in members],
        bad=bad,
    )


def _cache_paths(shard: Path, cache_dir: Path | None) -> list[Path]:
    """Where to look for the index, in order; the first is where it is written."""
    beside = shard.with_name(shard.name + INDEX_SUFFIX)
    if cache_dir is None:
        return [beside]
    digest = hashlib.sha256(str(shard.resolve()).encode()).hexdigest()[:16]
    return [cache_dir / f"{shard.name}.{digest}{INDEX_SUFFIX}", beside]


def load_index(shard: str | Path, cache_dir: str | Path | None = None) -> ShardIndex:
    """The index of `shard`, from its cache when size and mtime still match, else rebuilt."""
    shard = Path(shard)
    cdir = Path(cache_dir) if cache_dir is not None else None
    try:
        st = shard.stat()
    except FileNotFoundError:
        raise BadSampleError("missing_shard", shard.name, f"{shard} does not exist") from None
    paths = _cache_paths(shard, cdir)
    for p in paths:
        try:
            with open(p, encoding="utf-8") as f:
                idx = ShardIndex.from_json(json.load(f))
        except FileNotFoundError:
            continue
        except (OSError, ValueError, KeyError, TypeError, IndexError) as e:
            log.warning("ignoring unreadable index %s (%s); rebuilding", p, e)
            continue
        if idx.size == st.st_size and idx.mtime_ns == st.st_mtime_ns:
            return idx
        log.info("%s changed since it was indexed; rebuilding its index", shard)
    idx = scan_shard(shard)
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


if hasattr(os, "pread"):
    _pread = os.pread
else:  # pragma: no cover - Windows
    _seek_lock = threading.Lock()

    def _pread(fd: int, n: int, offset: int) -> bytes:
        with _seek_lock:
            os.lseek(fd, offset, os.SEEK_SET)
            return os.read(fd, n)


class _FdCache:
    """Per-process, bounded set of open shard files.

    Bounded because a shuffled read over thousands of shards would hit the
    open-file limit; reference counts keep a file open while a thread reads it.
    """

    def __init__(self, max_open: int) -> None:
        self.max_open = max_open
        self.lock = threading.Lock()
        self.fds: OrderedDict[int, list[int]] = OrderedDict()  # shard -> [fd, users]

    def acquire(self, s: int, path: Path, idx: ShardIndex, key: str) -> int:
        with self.lock:
            entry = self.fds.get(s)
            if entry is not None:
                self.fds.move_to_end(s)
                entry[1] += 1
                return entry[0]
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_BINARY", 0))
        except FileNotFoundError:
            raise BadSampleError(
                "missing_shard", f"{idx.name}:{key}", f"{path} does not exist"
            ) from None
        st = os.fstat(fd)
        if st.st_size != idx.size or st.st_mtime_ns != idx.mtime_ns:
            log.warning(
                "%s changed since it was indexed (size %d -> %d); reads may fail or differ. "
                "Restart to re-index it.",
                path,
                idx.size,
                st.st_size,
            )
        with self.lock:
            entry = self.fds.get(s)
            if entry is not None:  # another thread opened it meanwhile
                os.close(fd)
                entry[1] += 1
            else:
                entry = self.fds[s] = [fd, 1]
                self._evict()
            return entry[0]

    def release(self, s: int) -> None:
        with self.lock:
            self.fds[s][1] -= 1

    def _evict(self) -> None:
        if len(self.fds) <= self.max_open:
            return
        for s in [s for s, (_, users) in self.fds.items() if users == 0]:
            os.close(self.fds.pop(s)[0])
            if len(self.fds) <= self.max_open:
                return

    def close(self) -> None:
        with self.lock:
            for fd, _ in self.fds.values():
                os.close(fd)
            self.fds.clear()

    def forget(self) -> None:
        """In a forked child: close the inherited handles without the (maybe held) lock."""
        for fd, _ in self.fds.values():
            try:
                os.close(fd)
            except OSError:
                pass
        self.fds.clear()


class WebDatasetReader:
    """Reads samples of WebDataset shards by ``(shard, index)``.

    Picklable: the indexes loaded so far travel with it (so workers see exactly
    the samples the parent counted), file handles do not. Each process opens
    its own handles on first use, including after a fork.
    """

    def __init__(
        self,
        shards: list[str | Path],
        cache_dir: str | Path | None = None,
        max_open_files: int = 128,
    ) -> None:
        self.shards = [Path(s) for s in shards]
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None
        self.max_open_files = max_open_files
        self._indexes: list[ShardIndex | None] = [None] * len(self.shards)
        self._init_runtime()

    def _init_runtime(self) -> None:
        self._pid = os.getpid()
        self._load_lock = threading.Lock()
        self._fds = _FdCache(self.max_open_files)

    def _after_fork(self) -> None:
        """Handles and locks inherited through fork belong to the parent: start afresh."""
        self._fds.forget()
        self._init_runtime()

    def __getstate__(self) -> dict[str, Any]:
        return {
            "shards": self.shards,
            "cache_dir": self.cache_dir,
            "max_open_files": self.max_open_files,
            "indexes": self._indexes,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.shards = state["shards"]
        self.cache_dir = state["cache_dir"]
        self.max_open_files = state["max_open_files"]
        self._indexes = state["indexes"]
        self._init_runtime()

    @property
    def num_shards(self) -> int:
        return len(self.shards)

    def index(self, s: int) -> ShardIndex:
        """The index of shard `s`, loaded (or built) on first use."""
        idx = self._indexes[s]
        if idx is None:
            if self._pid != os.getpid():
                self._after_fork()
            with self._load_lock:
                idx = self._indexes[s]
                if idx is None:
                    idx = self._indexes[s] = load_index(self.shards[s], self.cache_dir)
        return idx

    def shard_len(self, s: int) -> int:
        return len(self.index(s))

    def describe_shard(self, s: int) -> dict[str, Any]:
        """What a checkpoint fingerprint records about shard `s` (mtime left out: copies differ)."""
        idx = self.index(s)
        return {"name": idx.name, "size": idx.size, "num_samples": len(idx)}

    def key(self, s: int, i: int) -> str:
        return self.index(s).keys[i]

    def read(self, s: int, i: int) -> dict[str, bytes | str]:
        """Raw bytes of sample `i` of shard `s` by extension; ``__key__``, ``__shard__`` are str."""
        idx = self._indexes[s] or self.index(s)
        if not 0 <= i < len(idx.keys):
            raise IndexError(f"sample {i} out of range for {idx.name} ({len(idx.keys)} samples)")
        key = idx.keys[i]
        if idx.bad and i in idx.bad:
            reason, detail = idx.bad[i]
            raise BadSampleError(reason, f"{idx.name}:{key}", detail)
        if self._pid != os.getpid():
            self._after_fork()
        fds = self._fds
        fd = fds.acquire(s, self.shards[s], idx, key)
        out: dict[str, bytes | str] = {"__key__": key, "__shard__": idx.name}
        try:
            for ext, offset, size in idx.members[i]:
                data = _pread(fd, size, offset)
                if len(data) != size:
                    raise BadSampleError(
                        "truncated_member",
                        f"{idx.name}:{key}",
                        f"{ext}: read {len(data)} of {size} bytes at offset {offset}; "
                        "the shard is shorter than when it was indexed",
                    )
                out[ext] = data
        finally:
            fds.release(s)
        return out

    def close(self) -> None:
        """Close this process's file handles (they reopen on the next read)."""
        if self._pid == os.getpid():
            self._fds.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass
