"""Random access to the samples of sharded containers with an offset table per shard.

MosaicML Streaming's MDS shards (``shard.00000.mds``) and LitData's optimized
chunks (``chunk-0-0.bin``) share one layout, which is what lets them be read
without a scan: a folder holds an ``index.json`` that lists its shards (file
name, sample count, byte size) and each shard opens with

    uint32 n | uint32 offsets[n + 1] | sample 0 | sample 1 | ...

(little-endian), ``offsets[i]`` the absolute byte position of sample ``i`` and
``offsets[n]`` the shard's end. A read of one sample is therefore one read of
its two offsets (the table is read once per shard and process) and one of its
bytes. How a sample's bytes split into columns is the container's own
(`zephon_vl.formats.mds`, `zephon_vl.formats.litdata`).

`ContainerRecords` has the surface of `RecordFiles` that `FormatReader` uses,
so these formats map their decoded samples to zephon's sample model the way the
other record formats do. Damage is named by shard: a shard whose size is not
what its index says is refused when the reader is built; a header that does not
match the index makes each of the shard's samples a ``corrupt_shard`` drop, and
a sample whose offsets point outside the shard (or whose columns do not fit its
bytes) a ``corrupt_sample`` drop, the same samples at every D.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from zephon_core import BadSampleError, ConfigError
from zephon_core.extend import base_name, is_remote, local_path, open_shard, read_whole, stat_shard

#: the index file of an MDS or LitData folder
INDEX = "index.json"
#: drop reasons of damaged shards and samples
CORRUPT_SHARD = "corrupt_shard"
CORRUPT_SAMPLE = "corrupt_sample"


def join(folder: str, name: str) -> str:
    """`name` inside `folder`, a path or a URL."""
    if is_remote(folder):
        return folder.rstrip("/") + "/" + name
    return os.fspath(local_path(folder) / name)


def folder_of(location: str) -> str:
    """The dataset folder a dataset's ``files`` entry names (the folder, or its index)."""
    text = os.fspath(location).rstrip("/")
    return text[: -len(INDEX) - 1] if base_name(text) == INDEX else text


@dataclass
class ContainerShard:
    """One shard as its folder's index lists it."""

    url: str
    samples: int
    size: int | None  # bytes, when the index says
    columns: list[str]  # the column (or leaf) names of its samples
    entry: dict  # the index's record of the shard: its part of the identity
    meta: dict = field(default_factory=dict)  # what the container decodes samples with


def load_index(folder: str, fmt: str) -> dict:
    """The parsed ``index.json`` of `folder`; ConfigError saying how to make one."""
    location = join(folder, INDEX)
    try:
        doc = json.loads(read_whole(location))
    except FileNotFoundError:
        raise ConfigError(f"{location} does not exist: a {fmt} dataset names the folder its "
                          f"writer made (with {INDEX} and its shards)") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{location} is not valid JSON ({exc}); write the dataset "
                          "again") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"{location} is not a {fmt} index (a JSON object)")
    return doc


def entry_digest(entry: dict) -> str:
    return hashlib.sha256(json.dumps(entry, sort_keys=True, default=str).encode()).hexdigest()


class ContainerRecords:
    """The samples of a container's shards by ``(shard, index)``, decoded to column dicts.

    Subclasses write `shards_of` (the index's shards of one folder) and `decode` (one
    sample's bytes to ``{column: value}``). Built in the driver; pickled to workers
    without open handles.
    """

    kind = ""

    def __init__(self, folders: list[str]) -> None:
        self.shards: list[ContainerShard] = []
        for folder in folders:
            self.shards += self.shards_of(folder_of(folder))
        self.files = [s.url for s in self.shards]
        self.kinds = [self.kind] * len(self.shards)
        self.entries = None  # no record manifest
        self.sizes = [s.samples for s in self.shards]
        self.bytes = [self._check_size(s) for s in self.shards]
        self._init_runtime()

    def shards_of(self, folder: str) -> list[ContainerShard]:
        raise NotImplementedError

    def decode(self, shard: ContainerShard, data: bytes, where: str) -> dict:
        raise NotImplementedError

    def _check_size(self, shard: ContainerShard) -> int:
        """The shard's byte size; refused when it is missing or not what its index says
        (a truncated or rewritten shard would misread its offsets)."""
        try:
            size = stat_shard(shard.url).size
        except BadSampleError:
            raise ConfigError(f"{shard.url} is listed in its {INDEX} but does not exist "
                              "(a compressed shard is not read: write it without "
                              "compression); copy the whole dataset folder") from None
        if shard.size is not None and size != shard.size:
            raise ConfigError(f"{shard.url} has {size} bytes, its {INDEX} says {shard.size}: "
                              "the shard is truncated or was changed after the index was "
                              "written; copy or write the dataset again")
        return size

    def _init_runtime(self) -> None:
        self._handles: dict[int, Any] = {}
        self._tables: dict[int, np.ndarray] = {}
        self._lock = threading.Lock()
        self._pid = os.getpid()

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items()
                if k not in ("_handles", "_tables", "_lock", "_pid")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._init_runtime()

    def __len__(self) -> int:
        return len(self.shards)

    def shard_identity(self, s: int) -> dict:
        """Name, byte size, sample count and the digest of the shard's index record (its
        hashes, columns and encodings when the index lists them)."""
        return {"name": base_name(self.files[s]), "bytes": self.bytes[s],
                "samples": self.sizes[s], "index": entry_digest(self.shards[s].entry)}

    def keys_of_first(self, s: int) -> list[str]:
        return list(self.shards[s].columns)

    def _handle(self, s: int) -> Any:
        if self._pid != os.getpid():  # handles inherited through fork are the parent's
            self._init_runtime()
        with self._lock:
            h = self._handles.get(s)
            if h is None:
                h = self._handles[s] = open_shard(self.files[s])
        return h

    def _table(self, s: int) -> np.ndarray:
        """Shard `s`' offset table (``n + 1`` entries), read once per process."""
        table = self._tables.get(s)
        if table is not None:
            return table
        h = self._handle(s)
        name, n = base_name(self.files[s]), self.sizes[s]
        if h.size != self.bytes[s]:
            raise BadSampleError(CORRUPT_SHARD, name, f"{name} has {h.size} bytes, had "
                                 f"{self.bytes[s]} when the reader was built: it changed")
        head = h.read_at(0, 4 * (n + 2))
        if len(head) < 4 * (n + 2) or int(np.frombuffer(head[:4], "<u4")[0]) != n:
            found = int(np.frombuffer(head[:4], "<u4")[0]) if len(head) >= 4 else None
            raise BadSampleError(CORRUPT_SHARD, name, f"{name} opens with a count of {found} "
                                 f"samples, its {INDEX} says {n}: the shard is damaged; "
                                 "write or download it again")
        table = np.frombuffer(head[4:], "<u4").astype(np.int64)
        with self._lock:
            self._tables[s] = table
        return table

    def read(self, s: int, i: int) -> dict:
        name = base_name(self.files[s])
        table = self._table(s)
        start, end = int(table[i]), int(table[i + 1])
        first = 4 * (self.sizes[s] + 2)
        if not first <= start <= end <= self.bytes[s]:
            raise BadSampleError(CORRUPT_SAMPLE, f"{name}:{i}",
                                 f"sample {i} of {name} lies at bytes {start}-{end}, outside "
                                 f"the shard's samples ({first}-{self.bytes[s]}): its offset "
                                 "table is damaged; write or download the shard again")
        data = self._handle(s).read_at(start, end - start)
        if len(data) != end - start:
            raise BadSampleError(CORRUPT_SAMPLE, f"{name}:{i}", f"sample {i} of {name} is "
                                 f"cut short ({len(data)} of {end - start} bytes)")
        return self.decode(self.shards[s], data, f"{name}:{i}")

    def read_many(self, pointers: list[tuple[int, int]]) -> list[Any]:
        return [self.read(s, i) for s, i in pointers]


def split_sizes(data: bytes, sizes: list[int], where: str) -> list[bytes]:
    """`data` cut into consecutive pieces of `sizes`; a `corrupt_sample` when they do not
    add up to its length."""
    if any(n < 0 for n in sizes) or sum(sizes) != len(data):
        raise BadSampleError(CORRUPT_SAMPLE, where, f"its column sizes {sizes[:8]} do not fit "
                             f"its {len(data)} bytes: the shard is damaged")
    out, pos = [], 0
    for n in sizes:
        out.append(data[pos:pos + n])
        pos += n
    return out


def raw_image(data: bytes, where: str) -> bytes:
    """A ``pil`` value (``uint32 width, height, len(mode)``, the mode, the raw pixels) as a
    lossless PNG, which the image decoder reads to exactly those pixels."""
    import io

    from PIL import Image

    if len(data) < 12:
        raise BadSampleError(CORRUPT_SAMPLE, where, "a raw image shorter than its header")
    width, height, mode_len = (int(v) for v in np.frombuffer(data[:12], "<u4"))
    try:
        mode = data[12:12 + mode_len].decode("ascii")
        image = Image.frombytes(mode, (width, height), data[12 + mode_len:])
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadSampleError(CORRUPT_SAMPLE, where, f"a raw {width}x{height} image does not "
                             f"fit its bytes ({exc})") from None
    buf = io.BytesIO()
    image.save(buf, "PNG", compress_level=1)
    return buf.getvalue()
