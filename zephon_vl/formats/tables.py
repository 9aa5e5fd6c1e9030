"""What the table containers (``arrow``, ``lance``) share: records by ``(shard, index)``
read through the container's own index, and the formats that read them.

A container holds the same columns the Hub's Parquet does (``datasets``' ``Image``
struct ``{bytes, path}``, ``texts``, ``conversations``, ``messages``), so both
formats are `HFParquetFormat` with another way to find a row: Arrow IPC record
batches found once by their byte offsets (`zephon_vl.formats.arrow_files`), a
Lance dataset's ``take`` by row (`zephon_vl.formats.lance_files`). Each fills
the surface `FormatReader` uses of `RecordFiles` (``files``, ``sizes``,
``kinds``, ``keys_of_first``, ``read``, ``read_many``, ``read_column``), so
drops, keys, references and the ledger are those of every record format.

The checkpoint fingerprint holds each shard's container identity (an Arrow
file's size, batch layout and a digest of its message headers; a Lance
fragment's dataset version), so a resume against changed data is refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from zephon_core import ConfigError, DatasetSpec
from zephon_core.extend import base_name
from zephon_vl.formats.base import FormatReader, RecordFormat
from zephon_vl.formats.hf_parquet import HFParquetFormat
from zephon_vl.formats.records import ROW_GROUP_CACHE
from zephon_vl.formats.references import MediaPlaces
from zephon_vl.formats.table_records import TableRecords


class ContainerReader(FormatReader):
    """A `FormatReader` over a container: media names are scanned from the container
    (only the columns that name media, without their bytes) instead of a record file."""

    def key(self, shard: int, index: int) -> str:
        name = base_name(self.records.files[shard])
        record = (self.records.read_column(shard, index, self.fields["id"])
                  if "id" in self.fields else None)
        return f"{name}:{self.format.key_of(record, self.fields, index)}"

    def media_identity(self, shard: int) -> dict:
        found = self._media.get(shard)
        if found is None:
            from zephon_vl.formats.media_identity import (
                FOLDERS,
                has_local_folder,
                media_identity,
                remember_listing,
                stat_listing,
            )

            folders = {k: self.folders.get(k) for k in FOLDERS}
            if not has_local_folder(folders):
                found = folders
            else:
                listing = stat_listing(self.media_refs(shard), self.places)
                found = media_identity(folders, listing)
                remember_listing(found["sha256"], listing)
            self._media[shard] = found
        return found

    def identity_change(self, shard: int, recorded: dict) -> str | None:
        theirs = recorded.get("media") if isinstance(recorded, dict) else None
        ours = self.media_identity(shard)
        if not isinstance(theirs, dict) or theirs.get("sha256") == ours.get("sha256"):
            return None
        from zephon_vl.formats.media_identity import changed_files, recall_listing, stat_listing

        old = recall_listing(str(theirs.get("sha256")))
        what = f"the media named by {base_name(self.records.files[shard])} changed"
        if old is None:
            return f"{what} since the checkpoint"
        return f"{what}: {changed_files(old, stat_listing(self.media_refs(shard), self.places))}"

    def media_refs(self, shard: int) -> list[list]:
        """``[ref, video]`` of every media path shard `shard`'s records name, each once."""
        media = {self.fields[k] for k in ("image", "images")}
        columns = [c for c in self.records.columns_of(shard) if c in media]
        seen: dict[str, None] = {}
        for record in (self.records.rows(shard, columns) if columns else ()):
            for ref in (r for c in columns for r in _as_refs(record.get(c))):
                if isinstance(ref, str) and ref:
                    seen.setdefault(ref, None)
        return [[ref, False] for ref in seen]


def _as_refs(value: Any) -> list:
    """The paths an ``image``/``images`` value names where it carries no bytes."""
    items = value if isinstance(value, list) else [value]
    out = []
    for item in items:
        if isinstance(item, dict):
            if not item.get("bytes"):
                out.append(item.get("path"))
        elif isinstance(item, str):
            out.append(item)
    return out


class ContainerFormat(HFParquetFormat):
    """`HFParquetFormat`'s records, read from a container instead of Parquet files."""

    #: `zephon_core.data.formats.dataset_reader` lets these formats take a folder
    reads_folders = True

    def records(self, spec: DatasetSpec, index_cache: str | None,
                cache: int) -> TableRecords:
        raise NotImplementedError

    def reader(self, spec: DatasetSpec, fields: Mapping[str, str],
               index_cache: str | None) -> FormatReader:
        from zephon_core.extend import option_path

        cache = spec.options.get("row_group_cache", ROW_GROUP_CACHE)
        if not isinstance(cache, int) or isinstance(cache, bool) or cache < 1:
            raise ConfigError(f"row_group_cache must be a positive integer, got {cache!r}")
        records = self.records(spec, index_cache, cache)
        self.check_files(records, fields)  # type: ignore[arg-type]
        folders = {k: option_path(spec, k) for k in ("image_folder", "video_folder")}
        places = MediaPlaces(folders, spec.options)
        self.check_first_references(records, fields, places)  # type: ignore[arg-type]
        return ContainerReader(self, dict(fields), records, folders,  # type: ignore[arg-type]
                               places, index_cache)


class ArrowFormat(ContainerFormat):
    """``arrow``: a ``datasets.Dataset.save_to_disk`` folder or Hub-cache ``.arrow``
    files (Arrow IPC streams), see `zephon_vl.formats.arrow_files`."""

    name = "arrow"

    def records(self, spec: DatasetSpec, index_cache: str | None,
                cache: int) -> TableRecords:
        from zephon_vl.formats.arrow_files import ArrowRecords

        return ArrowRecords(spec.file_list, index_cache, cache)


class LanceFormat(ContainerFormat):
    """``lance``: a Lance dataset folder (`zephon_vl.formats.lance_files`)."""

    name = "lance"
    options = (*RecordFormat.options, "version")

    def records(self, spec: DatasetSpec, index_cache: str | None,
                cache: int) -> TableRecords:
        from zephon_vl.formats.lance_files import LanceRecords

        version = spec.options.get("version")
        if version is not None and (not isinstance(version, int) or isinstance(version, bool)
                                    or version < 1):
            raise ConfigError(f"version of a lance dataset must be a positive integer (a "
                              f"version of the Lance dataset), got {version!r}")
        return LanceRecords(spec.file_list, version)
