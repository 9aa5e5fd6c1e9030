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
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from zephon_core import BadSampleError, ConfigError, ZephonError
from zephon_core.extend import (
    CORRUPT_ROW_GROUP,
    StoredFileIO,
    atomic_write,
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
from zephon_core.extend import cache_dir as default_cache_dir

log = logging.getLogger(__name__)

OFFSETS_SUFFIX = ".zoffsets.json"
OFFSETS_VERSION = 1
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


#: a JSON string (escapes included) or a bracket: what `_value_end` steps through
_JSON_TOKEN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]')
_CLOSING = {"[": "]", "{": "}"}


def _value_end(text: str, pos: int, where: str) -> int:
    """Where the JSON list or object starting at `pos` ends, found by matching brackets
    outside strings, without recursion: `json`'s decoder recurses once per level, so a
    record nested past the interpreter's stack raises `RecursionError` there (at a depth
    that depends on the caller's stack). Its syntax is checked when it is read, where it
    is a ``bad_json`` drop (`loads_sample` refuses more than 100 levels)."""
    stack: list[str] = []
    for m in _JSON_TOKEN.finditer(text, pos):
        token = m.group()
        if token in _CLOSING:
            stack.append(_CLOSING[token])
        elif token[0] != '"':
            if not stack or stack.pop() != token:
                raise ConfigError(f"{where}: not a valid JSON list (unmatched {token!r} at "
                                  f"character {m.start()})")
            if not stack:
                return m.end()
    raise ConfigError(f"{where}: not a valid JSON list (the record at character {pos} is "
                      "never closed)")


def json_offsets(data: bytes, where: str) -> np.ndarray:
    """``[2, n]`` int64: byte start and length of each record of a JSON list, or of each
    non-empty line when the file is JSON Lines (its first non-blank byte is not ``[``).
    A record nested too deeply to decode is stepped over (`_value_end`), not refused."""
    head = data.lstrip()[:1]
    if head != b"[":
        ends = np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == ord("\n"))
        starts = np.concatenate([[0], ends + 1])
        stops = np.concatenate([ends, [len(data)]])
        keep = stops > starts
        return np.stack([starts[keep], (stops - starts)[keep]]).astype(np.int64)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{where}: not UTF-8 JSON ({exc})") from None
    ascii_only = len(text) == len(data)
    decoder = json.JSONDecoder()
    starts: list[int] = []
    lengths: list[int] = []
    pos = text.index("[") + 1
    byte_pos, char_pos = pos, pos
    n = len(text)

    def skip(p: int) -> int:
        while p < n and text[p] in " \t\r\n":
            p += 1
        return p

    pos = skip(pos)
    if pos < n and text[pos] == "]":
        return np.zeros((2, 0), dtype=np.int64)
    while True:
        try:
            _, end = decoder.raw_decode(text, pos)
        except RecursionError:
            end = _value_end(text, pos, where)
        except ValueError as exc:
            raise ConfigError(f"{where}: not a valid JSON list ({exc})") from None
        if ascii_only:
            b_start, b_end = pos, end
        else:
            b_start = byte_pos + len(text[char_pos:pos].encode())
            b_end = b_start + len(text[pos:end].encode())
            byte_pos, char_pos = b_end, end
        starts.append(b_start)
        lengths.append(b_end - b_start)
        pos = skip(end)
        if pos < n and text[pos] == ",":
            pos = skip(pos + 1)
            continue
        if pos < n and text[pos] == "]":
            break
        raise ConfigError(f"{where}: not a valid JSON list (expected ',' or ']' at "
                          f"character {pos})")
    return np.array([starts, lengths], dtype=np.int64).reshape(2, -1)


def _offsets_cache(location: str, cache_dir: Path | None) -> list[Path]:
    """Where a JSON offset index is looked for; the first is where it is written."""
    name = base_name(location)
    digest = hashlib.sha256(os.fspath(location).encode()).hexdigest()[:16]
    if is_remote(location):
        folder = cache_dir if cache_dir is not None else default_cache_dir() / "record-index"
        return [folder / f"{name}.{digest}{OFFSETS_SUFFIX}"]
    beside = local_path(location).with_name(name + OFFSETS_SUFFIX)
    return [beside] if cache_dir is None else [cache_dir / f"{name}.{digest}{OFFSETS_SUFFIX}",
                                               beside]


def offsets_blob(location: str, size: int, identity: str, offsets: np.ndarray) -> str:
    """The JSON text of an offset index: the cache beside a file, or a manifest's sidecar."""
    return json.dumps({"version": OFFSETS_VERSION, "file": base_name(location), "size": size,
                       "identity": identity, "starts": offsets[0].tolist(),
                       "lengths": offsets[1].tolist()}, separators=(",", ":"))


def offsets_from_blob(text: str | bytes, size: int, identity: str) -> np.ndarray | None:
    """The offsets of an offset-index text when it describes `size` and `identity` (None:
    it describes other bytes). Raises ValueError/KeyError/TypeError on a malformed one."""
    obj = json.loads(text)
    if (obj["version"], obj["size"], obj["identity"]) != (OFFSETS_VERSION, size, identity):
        return None
    return np.array([obj["starts"], obj["lengths"]], dtype=np.int64).reshape(2, -1)


def load_json_offsets(location: str, cache_dir: str | Path | None = None) -> np.ndarray:
    """The offsets of a JSON/JSONL file, from its cache when size and identity match."""
    st = stat_shard(location)
    paths = _offsets_cache(location, Path(cache_dir) if cache_dir is not None else None)
    for p in paths:
        try:
            found = offsets_from_blob(p.read_text(), st.size, st.identity)
            if found is not None:
                return found
        except FileNotFoundError:
            continue
        except (OSError, ValueError, KeyError, TypeError) as e:
            log.info("ignoring unusable offset index %s (%s); rebuilding", p, e)
    offsets = json_offsets(read_whole(location), location)
    try:
        atomic_write(paths[0], offsets_blob(location, st.size, st.identity, offsets))
    except OSError as e:
        log.warning("cannot write offset index %s (%s); it lives in memory only. Give the "
                    "recipe an index_cache folder for read-only data folders.", paths[0], e)
    return offsets


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


class _ArrowSource(StoredFileIO):
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
                    source = pa.PythonFile(_ArrowSource(stored), mode="r")
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

