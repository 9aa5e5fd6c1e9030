"""Random access to the records of JSON, JSON Lines and Parquet files, local or remote.

Formats other than WebDataset keep one record per JSON list entry, JSONL line
or Parquet row. `RecordFiles` finds record ``index`` of file ``shard`` without
parsing the others: byte offsets for JSON (found once, the way the tar index
is, and cached beside the file or in ``index_cache`` keyed by size and
identity) and row groups for Parquet (a bounded cache of decoded row groups
per process). All bytes come through `zephon_core.data.storage`, so a URL
(``s3://``...) works where a path does.

Given the `RecordEntry` list of a record manifest (`zephon_vl.formats.manifest`),
counts, row groups and columns come from it and no file is stat'ed or opened
until one of its records is read; then its size and identity are checked
against the entry, and a JSON file's offsets come from the manifest's sidecar.
The offset index of a JSON file is `zephon_vl.formats.json_offsets`.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np

from zephon_core import BadSampleError, ConfigError, ZephonError
from zephon_core.extend import (
    CORRUPT_ROW_GROUP,
    StoredFileIO,
    base_name,
    corrupt_group_detail,
    is_parquet_damage,
    is_remote,
    loads_sample,
    local_path,
    open_parquet,
    open_shard,
    parquet_layout,
    read_checked_group,
    read_whole,
    stat_shard,
)
from zephon_vl.formats.json_offsets import (  # noqa: F401  (the offset index's names, here too)
    OFFSETS_SUFFIX,
    OFFSETS_VERSION,
    json_offsets,
    load_json_offsets,
    offsets_blob,
    offsets_from_blob,
)

log = logging.getLogger(__name__)

#: decoded Parquet row groups a reader keeps per process (a group is read whole)
ROW_GROUP_CACHE = 2
#: records of a JSON file read, at most, to find one that parses for the format check
FIRST_RECORDS = 16


def container_of(location: str) -> str:
    """``json`` (a JSON list, or JSON Lines), ``jsonl`` or ``parquet``, by suffix."""
    suffix = os.path.splitext(location.split("?")[0])[1].lower()
    kinds = {".json": "json", ".jsonl": "jsonl", ".parquet": "parquet"}
    if suffix not in kinds:
        raise ConfigError(f"{location}: cannot read {suffix or 'suffix-less'} files as "
                          "records; give .json (a list), .jsonl or .parquet files")
    return kinds[suffix]


class Where:
    """A record's address for drops and errors: ``file:key`` (here, below `base.py`, so that
    `media_identity.py` names records without importing the format base)."""

    __slots__ = ("file", "index", "key")

    def __init__(self, file: str, index: int, key: str) -> None:
        self.file, self.index, self.key = file, index, key

    def __str__(self) -> str:
        return f"{self.file}:{self.key}"


@dataclass(frozen=True)
class RecordEntry:
    """One record file as a record manifest lists it: enough to plan, fingerprint and
    check its fields without its bytes."""

    url: str
    size: int
    identity: str
    num_records: int
    keys: list[str]  # Parquet columns, or the first record's keys
    row_groups: list[int] | None = None  # Parquet: rows of each row group
    offsets: str | None = None  # JSON/JSONL: where its offset index lies (path or URL)
    media: dict | None = None  # the media its records name (`media_identity.indexed_media`)


def file_changed_error(name: str, field: str, indexed: Any, now: Any) -> ZephonError:
    """The refusal for a record file whose bytes are not those its manifest entry says."""
    return ZephonError(
        f"{name} changed since it was indexed into its manifest: {field} was {indexed}, is "
        f"now {now}. Its record offsets and row groups no longer apply. Re-index it "
        "(zephon-vl index --refresh MANIFEST) and start the run again; a checkpoint of the "
        "old data will be refused.")


class ArrowSource(StoredFileIO):
    """A `StoredFileIO` with the file-object surface ``pyarrow.PythonFile`` asks for."""

    closed = False

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def writable(self) -> bool:
        return False

    def close(self) -> None:
        self.closed = True


class RecordFiles:
    """Records of JSON/JSONL/Parquet files by ``(file, index)``: the raw dicts of a format.

    Built in the driver (it learns every file's record count); pickled to
    workers without open handles or cached row groups.
    """

    def __init__(self, files: list[str], index_cache: str | None = None,
                 row_group_cache: int = ROW_GROUP_CACHE,
                 entries: list[RecordEntry] | None = None) -> None:
        if entries is not None:
            files = [e.url for e in entries]
        self.files = [os.fspath(f) for f in files]
        self.kinds = [container_of(f) for f in self.files]
        self.row_group_cache = max(1, int(row_group_cache))
        self.entries = entries
        self.sizes: list[int] = []
        self.bytes: list[int] = []
        self.offsets: dict[int, np.ndarray] = {}
        self.group_starts: dict[int, np.ndarray] = {}
        self.columns: dict[int, list[str]] = {}
        self._init_runtime()
        for s in range(len(self.files)):
            if entries is not None:
                self._learn_entry(s, entries[s])
            else:
                self._learn_file(s, index_cache)

    def _learn_file(self, s: int, index_cache: str | None) -> None:
        """Count file `s`' records from its bytes: a stat, a Parquet footer or offsets."""
        f = self.files[s]
        if not is_remote(f) and not local_path(f).is_file():
            raise ConfigError(f"{f} does not exist; check the dataset's files")
        self.bytes.append(stat_shard(f).size)
        if self.kinds[s] == "parquet":
            rows, self.columns[s] = parquet_layout(self._parquet(s), f, self.bytes[s])
            self.group_starts[s] = np.concatenate([[0], np.cumsum(rows)]).astype(np.int64)
            self.sizes.append(int(self.group_starts[s][-1]))
        else:
            self.offsets[s] = load_json_offsets(f, index_cache)
            self.sizes.append(int(self.offsets[s].shape[1]))

    def _learn_entry(self, s: int, entry: RecordEntry) -> None:
        """Count file `s`' records from its manifest entry, touching no storage."""
        self.bytes.append(entry.size)
        self.sizes.append(entry.num_records)
        if self.kinds[s] == "parquet":
            rows = entry.row_groups or []
            if sum(rows) != entry.num_records:
                raise ConfigError(f"manifest entry of {entry.url}: row groups of {sum(rows)} "
                                  f"rows for {entry.num_records} records; index it again")
            self.group_starts[s] = np.concatenate([[0], np.cumsum(rows)]).astype(np.int64)
            self.columns[s] = list(entry.keys)
        elif entry.offsets is None:
            raise ConfigError(f"manifest entry of {entry.url} names no offset index; index "
                              "it again")

    def _check_entry(self, s: int, size: int, identity: str) -> None:
        """Refuse file `s` when its bytes are not those its manifest entry describes."""
        if self.entries is None:
            return
        entry = self.entries[s]
        for field, indexed, now in (("size", entry.size, size),
                                    ("identity", entry.identity, identity)):
            if indexed != now:
                raise file_changed_error(base_name(entry.url), field, indexed, now)

    def _offsets_of(self, s: int) -> np.ndarray:
        """JSON offsets of file `s`; from a manifest, its sidecar is read on first use."""
        found = self.offsets.get(s)
        if found is not None:
            return found
        assert self.entries is not None  # without a manifest they are learnt at build
        entry = self.entries[s]
        try:
            found = offsets_from_blob(read_whole(str(entry.offsets)), entry.size,
                                      entry.identity)
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ZephonError(f"cannot read the offset index {entry.offsets} of "
                              f"{base_name(entry.url)} named by its manifest ({e}); index "
                              "the files again with zephon-vl index") from None
        if found is None or found.shape[1] != entry.num_records:
            raise ZephonError(f"the offset index {entry.offsets} does not match the manifest "
                              f"entry of {base_name(entry.url)}; index the files again with "
                              "zephon-vl index")
        with self._lock:
            self.offsets[s] = found
        return found

    def _init_runtime(self) -> None:
        self._handles: dict[int, Any] = {}
        self._pq: dict[int, Any] = {}
        self._groups: OrderedDict[tuple[int, int], Any] = OrderedDict()
        #: row groups found damaged, with what their drops say (every row asks again)
        self._corrupt: dict[tuple[int, int], str] = {}
        self._lock = threading.Lock()
        self._remote_lock = threading.Lock()
        self._pid = os.getpid()

    def _check_process(self) -> None:
        """Handles inherited through fork belong to the parent: start afresh."""
        if self._pid != os.getpid():
            self._init_runtime()

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items()
                if k not in ("_handles", "_pq", "_groups", "_corrupt", "_lock", "_remote_lock",
                             "_pid")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._init_runtime()

    def __len__(self) -> int:
        return len(self.files)

    def shard_identity(self, s: int) -> dict:
        """File `s`' part of its reader's `shard_identity`: name, byte size, record count."""
        return {"name": base_name(self.files[s]), "bytes": self.bytes[s],
                "samples": self.sizes[s]}

    def keys_of_first(self, s: int) -> list[str]:
        """The keys of file `s`' records as the file declares them: Parquet columns, or the
        keys of its first record that parses (for errors that say what a file holds). A
        damaged first record is a drop like any other, so the next ones speak for the
        file; when none of the first `FIRST_RECORDS` parses, the first one's error."""
        if self.kinds[s] == "parquet":
            return self.columns[s]
        if self.entries is not None:
            return list(self.entries[s].keys)
        first: BadSampleError | None = None
        for i in range(min(self.sizes[s], FIRST_RECORDS)):
            try:
                rec = self.read(s, i)
            except BadSampleError as exc:
                first = first or exc
                continue
            return sorted(rec) if isinstance(rec, dict) else [f"<a {type(rec).__name__}>"]
        if first is not None:
            raise first
        return []

    def _handle(self, s: int) -> Any:
        self._check_process()
        with self._lock:
            h = self._handles.get(s)
            if h is None:
                h = open_shard(self.files[s])
                try:
                    self._check_entry(s, h.size, h.identity)
                except ZephonError:
                    h.close()
                    raise
                self._handles[s] = h
        return h

    def _parquet(self, s: int) -> Any:
        try:
            import pyarrow as pa
        except ImportError:
            raise ConfigError("reading Parquet needs pyarrow: pip install "
                              "'zephon-vl[parquet]'") from None
        self._check_process()
        with self._lock:
            found = self._pq.get(s)
            if found is None:
                f = self.files[s]
                if is_remote(f):
                    stored = open_shard(f)
                    self._check_entry(s, stored.size, stored.identity)
                    source = pa.PythonFile(ArrowSource(stored), mode="r")
                else:
                    if self.entries is not None:
                        st = stat_shard(f)
                        self._check_entry(s, st.size, st.identity)
                    source = str(local_path(f))
                found = self._pq[s] = open_parquet(source, f)
        return found

    def parquet_file(self, s: int) -> Any:
        """File `s`' ``pyarrow.parquet.ParquetFile`` (schema and row groups), opened once."""
        return self._parquet(s)

    def read(self, s: int, i: int) -> Any:
        if self.kinds[s] == "parquet":
            return self._row(s, i)
        start, length = (int(v) for v in self._offsets_of(s)[:, i])
        data = self._handle(s).read_at(start, length)
        return loads_sample(data, f"{base_name(self.files[s])} record {i}")

    def read_column(self, s: int, i: int, column: str) -> dict:
        """``{column: value}`` of Parquet row `i` (``{}`` when the file has no such column),
        decoding only that column of its row group (not cached)."""
        if column not in self.columns[s]:
            return {}
        g = self._group_of(s, i)
        table = self._decode_group(s, g, i, [column])
        return table.slice(i - int(self.group_starts[s][g]), 1).to_pylist()[0]

    def read_many(self, pointers: list[tuple[int, int]]) -> list[Any]:
        """The records of `pointers`, in their order, each Parquet row group they touch
        read once: a lane's shuffled group spans more row groups than the cache holds,
        and row by row it would decode a group once per row."""
        out: list[Any] = [None] * len(pointers)
        rows: dict[tuple[int, int], list[tuple[int, int]]] = {}
        for j, (s, i) in enumerate(pointers):
            if self.kinds[s] == "parquet":
                g = self._group_of(s, i)
                rows.setdefault((s, g), []).append((j, i - int(self.group_starts[s][g])))
            else:
                out[j] = self.read(s, i)
        for (s, g), wanted in sorted(rows.items()):
            table = self._row_group(s, g, int(self.group_starts[s][g]) + wanted[0][1]).take(
                [r for _, r in wanted])
            for (j, _), record in zip(wanted, table.to_pylist(), strict=True):
                out[j] = record
        return out

    def _group_of(self, s: int, i: int) -> int:
        return int(np.searchsorted(self.group_starts[s], i, side="right")) - 1

    def _row(self, s: int, i: int) -> dict:
        g = self._group_of(s, i)
        table = self._row_group(s, g, i)
        return table.slice(i - int(self.group_starts[s][g]), 1).to_pylist()[0]

    def _row_group(self, s: int, g: int, i: int) -> Any:
        """Row group `g` of file `s`, from the bounded cache or read (and cached); `i` is
        the row asked for, which a `corrupt_row_group` error names."""
        with self._lock:
            table = self._groups.get((s, g))
            if table is not None:
                self._groups.move_to_end((s, g))
        if table is None:
            table = self._decode_group(s, g, i)
            with self._lock:
                self._groups[(s, g)] = table
                while len(self._groups) > self.row_group_cache:
                    self._groups.popitem(last=False)
        return table

    def _decode_group(self, s: int, g: int, i: int, columns: list[str] | None = None) -> Any:
        """Row group `g` of file `s` decoded and checked (`validate(full=True)`: offsets,
        UTF-8). Bytes that do not decode are damage of that group alone: row `i` is a
        ``corrupt_row_group`` bad sample, so under ``on_error="drop"`` each of the group's
        rows is dropped (the same rows at every D: the decision is the file's bytes'), and
        under ``"raise"`` the run stops naming the file and the group. I/O errors pass."""
        known = self._corrupt.get((s, g))
        if known is None:
            pf = self._parquet(s)
            try:
                if is_remote(self.files[s]):  # one file object, one position: one at a time
                    with self._remote_lock:
                        return read_checked_group(pf, g, columns)
                return read_checked_group(pf, g, columns)
            except Exception as exc:
                if not is_parquet_damage(exc):
                    raise
                a, b = (int(v) for v in self.group_starts[s][g:g + 2])
                known = corrupt_group_detail(base_name(self.files[s]), g, a, b, exc)
                with self._lock:
                    self._corrupt[(s, g)] = known
        raise BadSampleError(CORRUPT_ROW_GROUP, f"{base_name(self.files[s])}:{i}", known)

