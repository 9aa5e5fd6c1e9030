"""The record surface of the table containers (``arrow``, ``lance``): records by
``(shard, index)`` read through the container's own index. A module of its own so that
each container's reader (`arrow_files`, `lance_files`) builds on it while the formats
(`zephon_vl.formats.tables`) name the readers, without a circle between them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

#: rows a scan for media names decodes at once
SCAN_ROWS = 256


class TableRecords:
    """Base of the containers: `files` names each shard (for drops and errors), `sizes`
    its records; subclasses write `take` (the records of rows of one shard, in order),
    `columns_of` and `shard_identity`. Pickled to workers without open handles."""

    kind = ""
    entries = None  # no record manifest: the container's own index is the index

    def __init__(self) -> None:
        self.files: list[str] = []
        self.sizes: list[int] = []

    @property
    def kinds(self) -> list[str]:
        return [self.kind] * len(self.files)

    def __len__(self) -> int:
        return len(self.files)

    def columns_of(self, s: int) -> list[str]:
        raise NotImplementedError

    def take(self, s: int, rows: list[int], columns: list[str] | None = None) -> list[dict]:
        raise NotImplementedError

    def shard_identity(self, s: int) -> dict:
        raise NotImplementedError

    def keys_of_first(self, s: int) -> list[str]:
        return list(self.columns_of(s))

    def read(self, s: int, i: int) -> dict:
        return self.take(s, [i])[0]

    def read_column(self, s: int, i: int, column: str) -> dict:
        """``{column: value}`` of record `i` (``{}`` when the shard has no such column)."""
        if column not in self.columns_of(s):
            return {}
        return self.take(s, [i], [column])[0]

    def read_many(self, pointers: list[tuple[int, int]]) -> list[dict]:
        """The records of `pointers` in their order, one `take` per shard."""
        out: list[Any] = [None] * len(pointers)
        by_shard: dict[int, list[tuple[int, int]]] = {}
        for j, (s, i) in enumerate(pointers):
            by_shard.setdefault(s, []).append((j, i))
        for s, wanted in sorted(by_shard.items()):
            for (j, _), record in zip(wanted, self.take(s, [i for _, i in wanted]),
                                      strict=True):
                out[j] = record
        return out

    def rows(self, s: int, columns: list[str]) -> Iterator[dict]:
        """Every record of shard `s`, only `columns`, a slice at a time (a media scan)."""
        for start in range(0, self.sizes[s], SCAN_ROWS):
            yield from self.take(s, list(range(start, min(start + SCAN_ROWS, self.sizes[s]))),
                                 columns)
