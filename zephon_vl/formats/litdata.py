"""``litdata``: a folder ``litdata.optimize`` wrote (``index.json`` and ``chunk-*.bin``).

Read without ``litdata``, from its documented layout. ``index.json`` lists the
``chunks`` (``filename``, ``chunk_size`` samples, ``chunk_bytes``) and a
``config`` with the sample's ``data_spec`` (its structure, a PyTree written as
JSON: a dict's keys, a list's or tuple's length) and ``data_format`` (the
serializer of each leaf, in order). A chunk opens with the offset table of
`zephon_vl.formats.containers`; one sample is the ``uint32`` byte size of each
leaf, then the leaves' bytes.

Leaves decode by serializer: ``bytes``, ``jpeg`` (image file bytes), ``pil``
(raw pixels: width, height, mode), ``video`` (the video file's bytes), ``str``,
``int``, ``float``, ``bool``. ``pickle`` and tensor/array leaves are not read
(a pickle runs code): a dataset whose fields use one is refused. A sample that
is a dict maps to zephon's sample model as the ``mds`` format's samples do;
a tuple or list has columns ``"0"``, ``"1"``... (rename them with ``fields``).
Compressed or encrypted chunks are not read.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from zephon_core import BadSampleError, ConfigError
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
from zephon_vl.formats.mds import MDSFormat

#: fixed-size scalar serializers and their numpy types
SCALARS = {"int": "<i8", "float": "<f8", "bool": "?"}
#: serializers whose value zephon reads (``image:<ext>``: ``litdata.Image``'s file bytes)
READABLE = {"bytes", "jpeg", "image", "pil", "video", "str", "text", *SCALARS}
#: serializers that keep a chunk's samples in its body (without one, litdata may write a
#: dict of plain values as an Arrow footer instead, which is not read)
MEDIA = {"audio", "video", "image", "jpeg", "jpeg_array", "pil", "tiff", "text", "file",
         "mesh", "pdf", "nifti", "graph", "tensor", "no_header_tensor", "no_header_numpy"}


def kind_of(serializer: str) -> str:
    """A ``data_format`` entry's serializer (``image:jpg`` -> ``image``)."""
    return serializer.split(":", 1)[0].lower()


def decode_leaf(serializer: str, data: bytes, where: str) -> Any:
    """One leaf's bytes as the value `to_sample` sees (images stay encoded bytes)."""
    kind = kind_of(serializer)
    if kind in ("bytes", "jpeg", "image", "video"):
        return data
    if kind == "pil":
        return raw_image(data, where)
    if kind in ("str", "text"):
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise BadSampleError(CORRUPT_SAMPLE, where, f"a str leaf is not UTF-8 ({exc})") \
                from None
    if serializer in SCALARS:
        return np.frombuffer(data, SCALARS[serializer])[0].item()
    return None  # not read: `LitDataFormat.reader` refuses fields naming it


def leaf_names(spec: Any, where: str) -> tuple[str, list[str]]:
    """The sample's kind (``dict``, ``list``, ``leaf``) and its top-level column names,
    one per leaf, from a ``data_spec`` node; nested containers are refused (they are
    no column of a record)."""
    node = spec[1] if isinstance(spec, list) and len(spec) == 2 else spec
    if not isinstance(node, dict):
        raise ConfigError(f"{where}: config.data_spec is not a PyTree spec")
    kind, children = node.get("type"), node.get("children_spec") or []
    if kind is None:
        return "leaf", ["0"]
    if any(c.get("type") is not None for c in children):
        raise ConfigError(f"{where}: the samples are nested containers; format 'litdata' "
                          "reads samples that are a dict (or tuple) of plain values")
    if kind in ("builtins.dict", "collections.OrderedDict"):
        keys = json.loads(node["context"]) if isinstance(node["context"], str) \
            else node["context"]
        return "dict", [str(k) for k in keys]
    if kind in ("builtins.list", "builtins.tuple"):
        return "list", [str(k) for k in range(len(children))]
    raise ConfigError(f"{where}: samples of type {kind!r}; format 'litdata' reads a dict, "
                      "list or tuple of values")


class LitDataRecords(ContainerRecords):
    """The samples of LitData folders as ``{column: value}`` dicts."""

    kind = "litdata"

    def shards_of(self, folder: str) -> list[ContainerShard]:
        doc = load_index(folder, "litdata")
        where = join(folder, INDEX)
        try:
            config, chunks = doc["config"], doc["chunks"]
            formats = list(config["data_format"])
            spec = config["data_spec"]
            spec = json.loads(spec) if isinstance(spec, str) else spec
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"{where}: no {exc} (expected the index litdata.optimize "
                              "writes)") from None
        if config.get("types") and not any(kind_of(f) in MEDIA for f in formats):
            raise ConfigError(f"{where}: samples of plain values ({formats}), which this "
                              "litdata writes as an Arrow footer; format 'litdata' reads "
                              "samples with an image (or other media) leaf")
        if config.get("item_loader", "PyTreeLoader") != "PyTreeLoader":
            raise ConfigError(f"{where}: item_loader {config['item_loader']!r}; format "
                              "'litdata' reads the default PyTreeLoader chunks")
        for key in ("compression", "compression_level", "encryption"):
            if config.get(key):
                raise ConfigError(f"{where}: chunks written with {key} "
                                  f"{config[key]!r}; format 'litdata' reads plain chunks "
                                  f"(optimize without {key})")
        _, names = leaf_names(spec, where)
        if len(names) != len(formats):
            raise ConfigError(f"{where}: data_spec has {len(names)} leaves, data_format "
                              f"{len(formats)}")
        config_digest = {k: config.get(k) for k in ("data_format", "data_spec")}
        shards = []
        for chunk in chunks:
            try:
                shards.append(ContainerShard(
                    url=join(folder, str(chunk["filename"])), samples=int(chunk["chunk_size"]),
                    size=int(chunk["chunk_bytes"]) if chunk.get("chunk_bytes") is not None
                    else None, columns=names, entry={**chunk, **config_digest},
                    meta={"formats": formats}))
            except (KeyError, TypeError, ValueError) as exc:
                raise ConfigError(f"{where}: a chunk entry lacks or mistypes {exc}") from None
        return shards

    def decode(self, shard: ContainerShard, data: bytes, where: str) -> dict:
        formats = shard.meta["formats"]
        head = 4 * len(formats)
        if len(data) < head:
            raise BadSampleError(CORRUPT_SAMPLE, where, "shorter than its leaf sizes")
        sizes = [int(n) for n in np.frombuffer(data[:head], "<u4")]
        pieces = split_sizes(data[head:], sizes, where)
        return {name: decode_leaf(fmt, piece, where)
                for name, fmt, piece in zip(shard.columns, formats, pieces, strict=True)}


class LitDataFormat(MDSFormat):
    """LitData folders, their samples mapped as the ``parquet`` format maps rows."""

    name = "litdata"
    records_class = LitDataRecords

    def check_columns(self, records: ContainerRecords, fields: Any) -> None:
        """Refuse a field that names a leaf zephon does not decode (a pickle, a tensor)."""
        for shard in records.shards:
            for column, fmt in zip(shard.columns, shard.meta["formats"], strict=True):
                if column in fields.values() and kind_of(fmt) not in READABLE:
                    raise ConfigError(f"{shard.url}: leaf {column!r} is serialized as "
                                      f"{fmt!r}, which format 'litdata' does not decode (it "
                                      f"reads {', '.join(sorted(READABLE))}); store it as "
                                      "bytes or str")
