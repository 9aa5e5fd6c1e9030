"""Arrow IPC files as Hugging Face ``datasets`` writes them, read by record batch.

``Dataset.save_to_disk`` writes a folder of ``data-0000k-of-0000n.arrow`` files
(listed, in order, by its ``state.json``); the Hub cache keeps each split as
``<name>-<split>-0000k-of-0000n.arrow``. Both are Arrow IPC *streams*: a schema
message, then record batches, with no footer to index them. So each file is
scanned once for its messages' byte ranges (only the headers are parsed: a
local file is memory-mapped, and its batch bodies are never read by the scan);
a read then decodes the one batch that holds the record, zero-copy from the map
(or a ranged read through the storage seam for a URL), and the last few
batches are kept per process (``row_group_cache``). An IPC *file* (``ARROW1``
magic) is read the same way, its footer unused.

A URL's scan reads the whole file once; its batch ranges are then kept under
``index_cache`` (or the user cache folder), keyed by the file's size and
identity. A file's fingerprint is its name, size, batch row counts and the
SHA-256 of its message headers (schema and every batch's buffer layout): it is
the same for copies of the file, and a rewrite that changes any value's length,
the row count or the schema is refused on resume.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import logging
import os
import re
import threading
from collections import OrderedDict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from zephon_core import ConfigError, ZephonError
from zephon_core.extend import (
    atomic_write,
    base_name,
    cache_dir,
    is_remote,
    local_path,
    open_shard,
    read_whole,
    stat_shard,
)
from zephon_vl.formats.records import ArrowSource
from zephon_vl.formats.table_records import TableRecords

log = logging.getLogger(__name__)

BATCHES_SUFFIX = ".zbatches.json"
BATCHES_VERSION = 1
#: a Hub-cache file name: ``<name>-<split>[-0000k-of-0000n].arrow``
HUB_FILE = re.compile(r"-(?P<split>[A-Za-z0-9_.]+?)(?:-\d{5}-of-\d{5})?\.arrow$")


def _pyarrow() -> Any:
    try:
        import pyarrow as pa
        import pyarrow.ipc  # noqa: F401
    except ImportError:
        raise ConfigError("format 'arrow' needs pyarrow: pip install 'zephon-vl[parquet]'") \
            from None
    return pa


def arrow_files(entry: str) -> list[str]:
    """The ``.arrow`` files one ``files`` entry names: the file itself, a ``save_to_disk``
    folder (the files its ``state.json`` lists, in order) or a folder of Hub-cache files
    of one split."""
    if entry.endswith(".arrow"):
        return [entry]
    remote = is_remote(entry)
    if not remote and not local_path(entry).is_dir():
        raise ConfigError(f"{entry} is neither an .arrow file nor a folder; an 'arrow' "
                          "dataset lists .arrow files or save_to_disk folders")
    join = (lambda name: entry.rstrip("/") + "/" + name) if remote \
        else (lambda name: str(local_path(entry) / name))
    if not remote and (local_path(entry) / "dataset_dict.json").is_file():
        splits = sorted(p.name for p in local_path(entry).iterdir() if p.is_dir())
        raise ConfigError(f"{entry} holds a DatasetDict (splits {', '.join(splits)}); name "
                          f"one split's folder, e.g. {join(splits[0]) if splits else entry}")
    try:
        state = json.loads(read_whole(join("state.json")))
        return [join(str(f["filename"])) for f in state["_data_files"]]
    except (FileNotFoundError, ZephonError):
        pass
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"{join('state.json')}: not a datasets state file ({exc})") from None
    if remote:
        raise ConfigError(f"{entry}: no state.json under this URL; list the dataset's .arrow "
                          "files in files = [...]")
    found = sorted(p.name for p in local_path(entry).iterdir() if p.name.endswith(".arrow"))
    if not found:
        raise ConfigError(f"{entry}: no .arrow files and no state.json; point at a "
                          "save_to_disk folder or list .arrow files")
    splits = sorted({m.group("split") for m in map(HUB_FILE.search, found) if m})
    if len(splits) > 1:
        raise ConfigError(f"{entry} holds the .arrow files of splits {', '.join(splits)}; "
                          "list one split's files in files = [...]")
    return [join(name) for name in found]


@dataclass
class BatchIndex:
    """Where an Arrow IPC file's messages lie: the schema's, and each record batch's
    ``[start, length]`` and row count; `digest` hashes every message header."""

    size: int
    identity: str
    schema: list[int]
    batches: list[list[int]]
    rows: list[int]
    digest: str


def scan_batches(source: Any, size: int, identity: str, where: str) -> BatchIndex:
    """The `BatchIndex` of an open Arrow source (a memory map or a Python file)."""
    pa = _pyarrow()
    start = 8 if source.read(6) == b"ARROW1" else 0
    source.seek(start)
    digest = hashlib.sha256()
    schema: list[int] = []
    batches: list[list[int]] = []
    rows: list[int] = []
    parsed = None
    try:
        reader = pa.ipc.MessageReader.open_stream(source)
        while True:
            try:
                message = reader.read_next_message()
            except StopIteration:
                break
            if message is None:
                break
            end = source.tell()
            digest.update(message.metadata.to_pybytes())
            if message.type == "schema":
                schema, parsed = [start, end - start], pa.ipc.read_schema(message)
            elif message.type == "record batch" and parsed is not None:
                batches.append([start, end - start])
                rows.append(pa.ipc.read_record_batch(message, parsed).num_rows)
            else:
                raise ConfigError(f"{where}: an Arrow message of type {message.type!r} at "
                                  f"byte {start}; zephon reads streams of one schema and "
                                  "record batches (no dictionary-encoded columns)")
            start = end
    except (OSError, ValueError) as exc:  # pyarrow's ArrowInvalid is a ValueError
        raise ConfigError(f"{where}: not an Arrow IPC stream or file as datasets writes "
                          f"them ({exc})") from None
    if parsed is None:
        raise ConfigError(f"{where}: an Arrow file without a schema message")
    return BatchIndex(size, identity, schema, batches, rows, digest.hexdigest())


def _cache_path(location: str, index_cache: str | None) -> Path:
    folder = Path(index_cache) if index_cache else cache_dir() / "record-index"
    digest = hashlib.sha256(location.encode()).hexdigest()[:16]
    return folder / f"{base_name(location)}.{digest}{BATCHES_SUFFIX}"


def batch_index(location: str, index_cache: str | None) -> BatchIndex:
    """The `BatchIndex` of a file: scanned from its memory map when local; for a URL,
    from the cache when it describes these bytes, else read once and cached."""
    pa = _pyarrow()
    st = stat_shard(location)
    if not is_remote(location):
        with pa.memory_map(str(local_path(location))) as source:
            return scan_batches(source, st.size, st.identity, location)
    path = _cache_path(location, index_cache)
    try:
        doc = json.loads(path.read_text())
        if (doc.pop("version"), doc["size"], doc["identity"]) == \
                (BATCHES_VERSION, st.size, st.identity):
            return BatchIndex(**doc)
    except FileNotFoundError:
        pass
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.info("ignoring unusable batch index %s (%s); scanning again", path, exc)
    stored = open_shard(location)
    try:
        found = scan_batches(pa.PythonFile(ArrowSource(stored), mode="r"), st.size, st.identity,
                             location)
    finally:
        stored.close()
    try:
        atomic_write(path, json.dumps({"version": BATCHES_VERSION, **asdict(found)}))
    except OSError as exc:
        log.warning("cannot write the batch index %s (%s): the next build reads %s again; "
                    "give the recipe an index_cache folder", path, exc, location)
    return found


class ArrowRecords(TableRecords):
    """The records of Arrow IPC files by ``(file, row)``: one shard per file."""

    kind = "arrow"

    def __init__(self, entries: list[str], index_cache: str | None = None,
                 batch_cache: int = 2) -> None:
        super().__init__()
        self.files = [f for e in entries for f in arrow_files(os.fspath(e))]
        self.batch_cache = batch_cache
        self.index = [batch_index(f, index_cache) for f in self.files]
        self.starts = [[0] for _ in self.files]
        for s, idx in enumerate(self.index):
            for n in idx.rows:
                self.starts[s].append(self.starts[s][-1] + n)
        self.sizes = [st[-1] for st in self.starts]
        self._init_runtime()

    def _init_runtime(self) -> None:
        self._maps: dict[int, Any] = {}
        self._schemas: dict[int, Any] = {}
        self._batches: OrderedDict[tuple[int, int], Any] = OrderedDict()
        self._lock = threading.Lock()
        self._pid = os.getpid()

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items()
                if k not in ("_maps", "_schemas", "_batches", "_lock", "_pid")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._init_runtime()

    def shard_identity(self, s: int) -> dict:
        idx = self.index[s]
        return {"name": base_name(self.files[s]), "bytes": idx.size, "samples": self.sizes[s],
                "batches": idx.rows, "headers_sha256": idx.digest}

    def columns_of(self, s: int) -> list[str]:
        return list(self._schema(s).names)

    def _bytes(self, s: int, start: int, length: int) -> Any:
        """Bytes `[start, start+length)` of file `s` as a pyarrow buffer (zero-copy from
        the memory map of a local file); a file changed since the build is refused."""
        pa = _pyarrow()
        if self._pid != os.getpid():
            self._init_runtime()
        f = self.files[s]
        if is_remote(f):
            stored = open_shard(f)
            try:
                self._check(s, stored.size, stored.identity)
                return pa.py_buffer(stored.read_at(start, length))
            finally:
                stored.close()
        with self._lock:
            whole = self._maps.get(s)
            if whole is None:
                st = stat_shard(f)
                self._check(s, st.size, st.identity)
                with pa.memory_map(str(local_path(f))) as source:
                    whole = self._maps[s] = source.read_buffer()
        return whole.slice(start, length)

    def _check(self, s: int, size: int, identity: str) -> None:
        idx = self.index[s]
        if (size, identity) != (idx.size, idx.identity):
            raise ZephonError(f"{self.files[s]} changed since the run was built (size "
                              f"{idx.size} -> {size}); its batch offsets no longer apply. "
                              "Start the run again; a checkpoint of the old data is refused.")

    def _schema(self, s: int) -> Any:
        found = self._schemas.get(s)
        if found is None:
            pa = _pyarrow()
            start, length = self.index[s].schema
            found = pa.ipc.read_schema(pa.ipc.read_message(self._bytes(s, start, length)))
            self._schemas[s] = found
        return found

    def _batch(self, s: int, b: int) -> Any:
        with self._lock:
            found = self._batches.get((s, b))
            if found is not None:
                self._batches.move_to_end((s, b))
                return found
        pa = _pyarrow()
        start, length = self.index[s].batches[b]
        message = pa.ipc.read_message(self._bytes(s, start, length))
        found = pa.ipc.read_record_batch(message, self._schema(s))
        with self._lock:
            self._batches[(s, b)] = found
            while len(self._batches) > self.batch_cache:
                self._batches.popitem(last=False)
        return found

    def take(self, s: int, rows: list[int], columns: list[str] | None = None) -> list[dict]:
        """Records `rows` of file `s` in their order, each batch they touch decoded once."""
        out: list[Any] = [None] * len(rows)
        by_batch: dict[int, list[tuple[int, int]]] = {}
        for j, i in enumerate(rows):
            b = bisect.bisect_right(self.starts[s], i) - 1
            by_batch.setdefault(b, []).append((j, i - self.starts[s][b]))
        for b, wanted in sorted(by_batch.items()):
            batch = self._batch(s, b)
            if columns is not None:
                batch = batch.select(columns)
            picked = batch.take([r for _, r in wanted]).to_pylist()
            for (j, _), record in zip(wanted, picked, strict=True):
                out[j] = record
        return out
