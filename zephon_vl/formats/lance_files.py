"""A Lance dataset (a folder ``pylance`` writes), read by row through Lance's own ``take``.

Each fragment of the dataset is one shard (so shards shuffle as fragments); a
record is fetched with ``LanceDataset.take`` at its row's offset in the dataset,
which reads only the pages that hold it. The dataset is read at one *version*:
the newest when the run is built (or the ``version`` the recipe pins), and that
version is in the fingerprint of every shard, so a resume after a write (an
append, an update, a deletion: each makes a new version) is refused.

Lance opens its files with its own object store, not zephon's storage seam, so
only local folders are read (a URL is refused, naming the limit).
"""

from __future__ import annotations

import os
import threading
from typing import Any

from zephon_core import ConfigError
from zephon_core.extend import base_name, is_remote
from zephon_vl.formats.table_records import TableRecords


def _lance() -> Any:
    try:
        import lance
    except ImportError:
        raise ConfigError("format 'lance' needs pylance: pip install 'zephon-vl[lance]'") \
            from None
    return lance


class LanceRecords(TableRecords):
    """The records of Lance datasets by ``(fragment, row)``: one shard per fragment."""

    kind = "lance"

    def __init__(self, entries: list[str], version: int | None = None) -> None:
        super().__init__()
        lance = _lance()
        self.uris: list[str] = []
        self.versions: list[int] = []
        self.shard_of: list[tuple[int, int, int]] = []  # (dataset, fragment id, first row)
        for d, entry in enumerate(os.fspath(e) for e in entries):
            if is_remote(entry):
                raise ConfigError(f"{entry}: format 'lance' reads local Lance folders only "
                                  "(Lance's own object store is not zephon's storage seam)")
            if not os.path.isdir(entry):
                raise ConfigError(f"{entry} is not a Lance dataset folder")
            try:
                ds = lance.dataset(entry, version=version)
            except (OSError, ValueError, RuntimeError) as exc:
                raise ConfigError(f"{entry}: cannot open it as a Lance dataset"
                                  f"{f' at version {version}' if version else ''} ({exc})") \
                    from None
            self.uris.append(entry)
            self.versions.append(int(ds.version))
            first = 0
            for fragment in ds.get_fragments():
                rows = int(fragment.count_rows())
                self.shard_of.append((d, int(fragment.fragment_id), first))
                self.files.append(f"{base_name(entry.rstrip(os.sep))}#{fragment.fragment_id}")
                self.sizes.append(rows)
                first += rows
        self._init_runtime()

    def _init_runtime(self) -> None:
        self._open: dict[int, Any] = {}
        self._lock = threading.Lock()
        self._pid = os.getpid()

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k not in ("_open", "_lock", "_pid")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._init_runtime()

    def _dataset(self, d: int) -> Any:
        """Dataset `d` at the version the run was built with, opened once per process."""
        if self._pid != os.getpid():
            self._init_runtime()
        with self._lock:
            found = self._open.get(d)
            if found is None:
                found = self._open[d] = _lance().dataset(self.uris[d], version=self.versions[d])
        return found

    def shard_identity(self, s: int) -> dict:
        d, fragment, first = self.shard_of[s]
        return {"name": self.files[s], "version": self.versions[d], "fragment": fragment,
                "first_row": first, "samples": self.sizes[s]}

    def columns_of(self, s: int) -> list[str]:
        return list(self._dataset(self.shard_of[s][0]).schema.names)

    def take(self, s: int, rows: list[int], columns: list[str] | None = None) -> list[dict]:
        d, _, first = self.shard_of[s]
        table = self._dataset(d).take([first + i for i in rows], columns=columns)
        return table.to_pylist()
