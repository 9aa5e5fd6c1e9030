"""Shard readers: random access to samples by `(shard, index)`.

A reader is created in the driver (to learn shard sizes) and pickled to
workers, so it opens files lazily and keeps no handle in its pickled state.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from zephon_core.common.jsontext import loads_sample
from zephon_core.data.parquet import (
    CORRUPT_ROW_GROUP,
    corrupt_group_detail,
    is_parquet_damage,
    open_parquet,
    parquet_layout,
    read_checked_group,
)
from zephon_core.errors import BadSampleError, ConfigError


@runtime_checkable
class ShardReader(Protocol):
    """What a dataset needs from its storage: shards of numbered samples.

    Required: `num_shards`, `shard_len`, `shard_identity` (a JSON view of one shard for
    fingerprints and errors) and `read`. A reader may also offer optional capabilities,
    each a small protocol below, which the engine uses when present (and never needs):

    - `ReadsMany`: ``read_many(pointers)``, a whole group at once, so neighbouring samples
      of one remote shard share a range request (`WebDatasetReader` for URLs);
    - `KnowsShardLengths`: ``shard_lengths()``, every shard's length without opening
      shards (a manifest answers it);
    - `NamesSamples`: ``key(shard, index)``, the sample's own key (a tar member's stem,
      a record's id), written to the ledger and shown by ``zephon-vl inspect-data``;
    - `ExplainsChanges`: ``identity_change(shard, recorded)``, what changed in a shard
      since a checkpoint recorded its identity, for the refusal of that checkpoint.
    """

    @property
    def num_shards(self) -> int: ...

    def shard_len(self, shard: int) -> int: ...

    def shard_identity(self, shard: int) -> dict: ...

    def read(self, shard: int, index: int) -> Any: ...


@runtime_checkable
class ReadsMany(Protocol):
    """Optional: `read` of many ``(shard, index)`` pointers at once, in their order."""

    def read_many(self, pointers: list[tuple[int, int]]) -> list[Any]: ...


@runtime_checkable
class KnowsShardLengths(Protocol):
    """Optional: every shard's sample count, in shard order, without opening a shard."""

    def shard_lengths(self) -> list[int]: ...


@runtime_checkable
class NamesSamples(Protocol):
    """Optional: the sample's own key (stable across runs), for ledgers and inspection."""

    def key(self, shard: int, index: int) -> str: ...


@runtime_checkable
class ExplainsChanges(Protocol):
    """Optional: what changed in `shard` since its `shard_identity` was `recorded` (a clause
    naming the files, e.g. the images a record file names), or None when it cannot say."""

    def identity_change(self, shard: int, recorded: dict) -> str | None: ...


def shard_lengths(reader: ShardReader) -> list[int]:
    """Every shard's sample count, through `KnowsShardLengths` when the reader has it,
    else shard by shard."""
    if isinstance(reader, KnowsShardLengths):
        return [int(n) for n in reader.shard_lengths()]
    return [reader.shard_len(s) for s in range(reader.num_shards)]


def sample_key_of(reader: ShardReader) -> Any:
    """The reader's ``key(shard, index)`` (`NamesSamples`), or None."""
    return reader.key if isinstance(reader, NamesSamples) else None


class InMemoryReader:
    """Samples held in Python lists, one list per shard (tests, small corpora)."""

    def __init__(self, shards: list[list[Any]], name: str = "memory") -> None:
        self.shards = [list(s) for s in shards]
        self.name = name

    @property
    def num_shards(self) -> int:
        return len(self.shards)

    def shard_len(self, shard: int) -> int:
        return len(self.shards[shard])

    def shard_identity(self, shard: int) -> dict:
        blob = json.dumps(self.shards[shard], sort_keys=True, default=str).encode()
        return {
            "name": f"{self.name}[{shard}]",
            "samples": len(self.shards[shard]),
            "sha256": hashlib.sha256(blob).hexdigest(),
        }

    def read(self, shard: int, index: int) -> Any:
        return self.shards[shard][index]


def _file_identity(path: Path, samples: int) -> dict:
    return {"name": path.name, "bytes": path.stat().st_size, "samples": samples}


class JsonlReader:
    """JSON Lines shards: one JSON object per non-empty line.

    Line offsets are found once per process with numpy (a few ms per 100 MB).
    """

    def __init__(self, paths: list[str | os.PathLike]) -> None:
        self.paths = [Path(p) for p in paths]
        for p in self.paths:
            if not p.is_file():
                raise ConfigError(f"JSONL shard {p} does not exist; check the dataset's paths")
        self._offsets: dict[int, np.ndarray] = {}
        self._sizes = [self._line_offsets(s).shape[1] for s in range(len(self.paths))]

    def __getstate__(self) -> dict:
        return {"paths": self.paths, "_sizes": self._sizes}

    def __setstate__(self, state: dict) -> None:
        self.paths = state["paths"]
        self._sizes = state["_sizes"]
        self._offsets = {}

    @property
    def num_shards(self) -> int:
        return len(self.paths)

    def shard_len(self, shard: int) -> int:
        return self._sizes[shard]

    def shard_identity(self, shard: int) -> dict:
        return _file_identity(self.paths[shard], self._sizes[shard])

    def _line_offsets(self, shard: int) -> np.ndarray:
        """`[2, n]` array: start offset and length of each non-empty line."""
        found = self._offsets.get(shard)
        if found is None:
            data = np.fromfile(self.paths[shard], dtype=np.uint8)
            ends = np.flatnonzero(data == ord("\n"))
            starts = np.concatenate([[0], ends + 1])
            stops = np.concatenate([ends, [len(data)]])
            keep = stops > starts
            found = np.stack([starts[keep], stops[keep] - starts[keep]]).astype(np.int64)
            self._offsets[shard] = found
        return found

    def read(self, shard: int, index: int) -> Any:
        start, length = (int(v) for v in self._line_offsets(shard)[:, index])
        with open(self.paths[shard], "rb") as f:
            f.seek(start)
            line = f.read(length)
        return loads_sample(line, f"{self.paths[shard].name} record {index}",
                            reason="corrupt_json")


class ParquetReader:
    """Parquet shards, read one row group at a time (the last one is cached per shard)."""

    def __init__(self, paths: list[str | os.PathLike], columns: list[str] | None = None) -> None:
        try:
            import pyarrow.parquet  # noqa: F401  (the formats below need it)
        except ImportError:
            raise ConfigError("reading Parquet shards needs pyarrow: pip install "
                              "'zephon-vl[parquet]'") from None

        self.paths = [Path(p) for p in paths]
        self.columns = columns
        self._group_starts: list[np.ndarray] = []
        for p in self.paths:
            if not p.is_file():
                raise ConfigError(f"Parquet shard {p} does not exist; check the dataset's paths")
            rows, _ = parquet_layout(open_parquet(str(p), str(p)), str(p), p.stat().st_size)
            self._group_starts.append(np.concatenate([[0], np.cumsum(rows)]).astype(np.int64))
        self._cache: dict[int, tuple[int, list[dict]]] = {}

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_cache"] = {}
        return state

    @property
    def num_shards(self) -> int:
        return len(self.paths)

    def shard_len(self, shard: int) -> int:
        return int(self._group_starts[shard][-1])

    def shard_identity(self, shard: int) -> dict:
        return _file_identity(self.paths[shard], self.shard_len(shard))

    def read(self, shard: int, index: int) -> Any:
        starts = self._group_starts[shard]
        group = int(np.searchsorted(starts, index, side="right")) - 1
        cached = self._cache.get(shard)
        if cached is None or cached[0] != group:
            name = self.paths[shard].name
            try:
                table = read_checked_group(open_parquet(str(self.paths[shard]), name), group,
                                           self.columns)
            except Exception as exc:  # damage of this group: each of its rows is bad
                if not is_parquet_damage(exc):
                    raise
                raise BadSampleError(CORRUPT_ROW_GROUP, f"{name}:{index}", corrupt_group_detail(
                    name, group, int(starts[group]), int(starts[group + 1]), exc)) from None
            cached = (group, table.to_pylist())
            self._cache[shard] = cached
        return cached[1][index - int(starts[group])]


def reader_for(files: Sequence[str | os.PathLike]) -> ShardReader:
    """The ``text`` format's reader: JSONL or Parquet, by the files' suffix."""
    paths = [Path(f) for f in files]
    if not paths:
        raise ConfigError("a dataset needs at least one file")
    suffixes = {p.suffix.lower() for p in paths}
    if suffixes <= {".jsonl", ".json"}:
        return JsonlReader(paths)
    if suffixes == {".parquet"}:
        return ParquetReader(paths)
    raise ConfigError(f"cannot read files with suffixes {sorted(suffixes)}: a dataset is "
                      "either .jsonl or .parquet files")
