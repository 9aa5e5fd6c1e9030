"""``mds``: a MosaicML Streaming dataset folder (``index.json`` and ``shard.*.mds``).

Read without ``mosaicml-streaming``, from its documented layout. The index
lists each shard's ``raw_data`` (``basename``, ``bytes``, ``hashes``),
``samples``, ``column_names``, ``column_encodings`` and ``column_sizes`` (a
byte count for a fixed-size column, null for a variable one). A shard opens
with the offset table of `zephon_vl.formats.containers`; one sample is the
``uint32`` sizes of its variable-size columns, then every column's bytes in
column order.

Columns decode by encoding: ``bytes``, ``jpeg``, ``png`` (image file bytes:
the pixels the writer stored), ``pil`` (raw pixels: width, height, mode),
``str``, ``json``, and the numeric ones (``int``, ``int8``...``float64``).
``pkl`` columns are not unpickled (a pickle runs code): a dataset whose fields
use one is refused. A sample maps to zephon's sample model as the ``parquet``
format's rows do (``image``/``images``, ``conversations``/``messages``/``texts``;
a ``str`` column holding JSON is parsed). Compressed shards (``zip_data``)
are not read.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import numpy as np

from zephon_core import BadSampleError, ConfigError, DatasetSpec
from zephon_core.extend import base_name, option_path
from zephon_vl.formats.base import FormatReader, Where, bad
from zephon_vl.formats.containers import (
    CORRUPT_SAMPLE,
    INDEX,
    ContainerRecords,
    ContainerShard,
    join,
    load_index,
    raw_image,
    split_sizes,
)
from zephon_vl.formats.hf_parquet import HFParquetFormat
from zephon_vl.formats.references import OPTIONS as REFERENCE_OPTIONS
from zephon_vl.formats.references import MediaPlaces

#: numeric encodings and their numpy types (little-endian, as the writer stores them)
NUMERIC = {"int": "<i8", "int8": "<i1", "int16": "<i2", "int32": "<i4", "int64": "<i8",
           "uint8": "<u1", "uint16": "<u2", "uint32": "<u4", "uint64": "<u8",
           "float16": "<f2", "float32": "<f4", "float64": "<f8"}
#: image list encodings: ``uint32`` 0, count, the sizes, then each image's encoding
LISTS = {"list[jpeg]": "jpeg", "list[png]": "png", "list[pil]": "pil"}
#: encodings whose value zephon reads
READABLE = {"bytes", "jpeg", "png", "pil", "str", "json", *NUMERIC, *LISTS}


def decode_value(encoding: str, data: bytes, where: str) -> Any:
    """One column's bytes as the value `to_sample` sees (images stay encoded bytes)."""
    if encoding in ("bytes", "jpeg", "png"):
        return data
    if encoding == "pil":
        return raw_image(data, where)
    if encoding in LISTS:
        return [decode_value(LISTS[encoding], piece, where) for piece in image_list(data, where)]
    try:
        if encoding == "str":
            return data.decode("utf-8")
        if encoding == "json":
            return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise BadSampleError(CORRUPT_SAMPLE, where, f"a {encoding} column does not "
                             f"decode ({exc})") from None
    if encoding in NUMERIC:
        return np.frombuffer(data, NUMERIC[encoding])[0].item()
    return None  # not read (e.g. pkl): `MDSFormat.reader` refuses fields naming it


def image_list(data: bytes, where: str) -> list[bytes]:
    """The pieces of a ``list[...]`` value."""
    count = int(np.frombuffer(data[4:8], "<u4")[0]) if len(data) >= 8 else -1
    if count < 0 or len(data) < 8 + 4 * count:
        raise BadSampleError(CORRUPT_SAMPLE, where, "an image list shorter than its header")
    sizes = [int(n) for n in np.frombuffer(data[8:8 + 4 * count], "<u4")]
    return split_sizes(data[8 + 4 * count:], sizes, where)


class MDSRecords(ContainerRecords):
    """The samples of MDS folders as ``{column: value}`` dicts."""

    kind = "mds"

    def shards_of(self, folder: str) -> list[ContainerShard]:
        doc = load_index(folder, "mds")
        where = join(folder, INDEX)
        shards = doc.get("shards")
        if not isinstance(shards, list):
            raise ConfigError(f"{where} has no 'shards' list: not a MosaicML Streaming index")
        return [self._shard(folder, where, entry) for entry in shards]

    def _shard(self, folder: str, where: str, entry: Any) -> ContainerShard:
        try:
            if entry["format"] != "mds":
                raise ConfigError(f"{where}: a shard of format {entry['format']!r}; format "
                                  "'mds' reads MDS shards only")
            if entry.get("compression"):
                raise ConfigError(f"{where}: shards compressed with {entry['compression']!r}; "
                                  "format 'mds' reads uncompressed shards (write them with "
                                  "compression=None)")
            raw = entry["raw_data"]
            names, encodings = list(entry["column_names"]), list(entry["column_encodings"])
            sizes = list(entry["column_sizes"])
            shard = ContainerShard(
                url=join(folder, str(raw["basename"])), samples=int(entry["samples"]),
                size=int(raw["bytes"]) if raw.get("bytes") is not None else None,
                columns=names, entry=entry,
                meta={"encodings": encodings, "sizes": sizes})
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"{where}: a shard entry lacks or mistypes {exc} (expected "
                              "MosaicML Streaming's MDS index)") from None
        if not len(names) == len(encodings) == len(sizes):
            raise ConfigError(f"{where}: {base_name(shard.url)} lists {len(names)} columns, "
                              f"{len(encodings)} encodings and {len(sizes)} sizes")
        return shard

    def decode(self, shard: ContainerShard, data: bytes, where: str) -> dict:
        encodings, fixed = shard.meta["encodings"], shard.meta["sizes"]
        variable = sum(1 for n in fixed if n is None)
        if len(data) < 4 * variable:
            raise BadSampleError(CORRUPT_SAMPLE, where, "shorter than its column sizes")
        head = np.frombuffer(data[:4 * variable], "<u4").tolist()
        sizes, k = [], 0
        for n in fixed:
            if n is None:
                sizes.append(int(head[k]))
                k += 1
            else:
                sizes.append(int(n))
        pieces = split_sizes(data[4 * variable:], sizes, where)
        return {name: decode_value(enc, piece, where)
                for name, enc, piece in zip(shard.columns, encodings, pieces, strict=True)}


class MDSFormat(HFParquetFormat):
    """MDS folders, their samples mapped as the ``parquet`` format maps rows."""

    name = "mds"
    #: a dataset's ``files`` name its folders (`dataset_reader` refuses folders otherwise)
    reads_folders = True
    options = ("image_folder", "video_folder", *REFERENCE_OPTIONS)
    records_class: type[ContainerRecords] = MDSRecords

    def reader(self, spec: DatasetSpec, fields: Mapping[str, str],
               index_cache: str | None) -> FormatReader:
        records = self.records_class(spec.file_list)
        self.check_files(records, fields)  # type: ignore[arg-type]
        self.check_columns(records, fields)
        folders = {k: option_path(spec, k) for k in ("image_folder", "video_folder")}
        places = MediaPlaces(folders, spec.options)
        return FormatReader(self, dict(fields), records, folders,  # type: ignore[arg-type]
                            places, index_cache)

    def check_columns(self, records: ContainerRecords, fields: Mapping[str, str]) -> None:
        """Refuse a field that names a column zephon does not decode (a pickle)."""
        for shard in records.shards:
            encodings = shard.meta.get("encodings")
            if encodings is None:
                continue
            for column, enc in zip(shard.columns, encodings, strict=True):
                if column in fields.values() and enc not in READABLE:
                    raise ConfigError(f"{shard.url}: column {column!r} is {enc!r}, which "
                                      f"format 'mds' does not decode (it reads "
                                      f"{', '.join(sorted(READABLE))}); write it as bytes, "
                                      "str or json")

    def to_sample(self, record: dict, fields: Mapping[str, str], where: Where) -> dict:
        return super().to_sample(parse_json_text(record, fields, where), fields, where)


def parse_json_text(record: dict, fields: Mapping[str, str], where: Where) -> dict:
    """A chat column stored as a JSON string (``str`` columns are common) parsed."""
    out = dict(record)
    for name in ("conversations", "messages", "texts"):
        key = fields.get(name)
        value = out.get(key) if key else None
        if isinstance(value, str):
            try:
                out[key] = json.loads(value)
            except ValueError as exc:
                raise bad(where, f"column {key!r} is a string that is not JSON ({exc})") \
                    from None
    return out
