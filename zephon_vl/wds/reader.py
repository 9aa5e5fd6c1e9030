"""Read samples of WebDataset shards by ``(shard, index)`` through their indexes.

The indexes come from `zephon_vl.wds.shard_index` (see `zephon_vl.wds.index`
for the whole story); reads are ``read_at`` calls at recorded offsets, each
process keeping a bounded set of shards open (`_OpenShards`).
"""

from __future__ import annotations

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
    base_name,
    current_storage,
    is_remote,
    local_path,
    open_shard,
)
from zephon_vl.wds.shard_index import ShardIndex, load_index, read_index_file, shard_changed_error


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
                stored.forget()
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
