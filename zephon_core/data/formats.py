"""Dataset formats: how a dataset's files become a reader, named, not guessed.

A dataset names its ``format`` (TOML ``[[datasets]] format = "llava"``, or
``DatasetSpec(format=...)`` in Python). Each format is one object that knows
its files' layout, the record fields it reads (renamable per dataset through
``fields``, like Megatron-Energon's field map) and the dataset options it
takes (``image_folder``...); it builds the dataset's `ShardReader`. Without a
format, the files' suffix picks one: the format registered with that suffix
(``webdataset`` declares ``.tar`` shards and ``.json`` manifests), else ``text``.

The core registers only ``text``; other formats come from plugins
(`zephon_core.common.plugins`: zephon_vl's and any installed package's) or a
user's `register_format`, each by ``"module:attribute"`` imported only when a
dataset asks for it.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from zephon_core.common.plugins import ensure_plugins, plugin_hint
from zephon_core.data.locations import is_remote
from zephon_core.data.readers import ShardReader
from zephon_core.errors import ConfigError, ZephonError

Files = Sequence[str | os.PathLike]


@dataclass(frozen=True)
class DatasetSpec:
    """One dataset as a recipe names it: its files, their format, renamed fields, options.

    `files` is a list of paths or URLs (a ``webdataset`` dataset may instead
    be one manifest path); `format` None picks one by suffix; `fields` maps a
    field the format reads to the key or column that holds it in these files;
    `options` are the format's own dataset keys (e.g. ``image_folder``).
    """

    files: Files | str
    format: str | None = None
    fields: Mapping[str, str] = field(default_factory=dict)
    options: Mapping[str, Any] = field(default_factory=dict)

    @property
    def file_list(self) -> list[str]:
        if isinstance(self.files, (str, os.PathLike)):
            return [os.fspath(self.files)]
        return [os.fspath(f) for f in self.files]


@runtime_checkable
class DataFormat(Protocol):
    """What a dataset format provides (docs/data-formats.md lists the registered ones)."""

    #: the registry name (``format = "<name>"``)
    name: str
    #: every field the format reads -> the key or column it reads by default
    fields: Mapping[str, str]
    #: the dataset options it accepts, e.g. ``("image_folder",)``
    options: tuple[str, ...]
    #: the options among them that name files or folders, each a path or URL or a list of
    #: them: a recipe file resolves them relative to itself, like its ``files``
    path_options: tuple[str, ...]
    #: a dataset's ``files`` may name folders (mds, litdata: a dataset is a folder of
    #: shards); False: `dataset_reader` refuses a folder, naming it
    reads_folders: bool

    def reader(self, spec: DatasetSpec, fields: Mapping[str, str],
               index_cache: str | None) -> ShardReader:
        """The dataset's reader; `fields` is the format's field table with `spec`'s overrides.

        Raises ConfigError when the files do not hold this format's records,
        naming the file and the keys it saw.
        """


class TextFormat:
    """JSONL or Parquet records of text: ``{"text": str}`` or a chat under
    ``conversations``/``messages`` (the readers zephon always had).

    Each file's first record (a Parquet file's columns) must hold one of
    those keys, so data of another format is refused by name instead of
    every record being dropped as ``missing_text``.
    """

    name = "text"
    fields: Mapping[str, str] = {"text": "text"}
    options: tuple[str, ...] = ()
    path_options: tuple[str, ...] = ()
    reads_folders = False
    chats = ("conversations", "messages")

    def reader(self, spec: DatasetSpec, fields: Mapping[str, str],
               index_cache: str | None) -> ShardReader:
        from zephon_core.data.readers import reader_for

        reader = reader_for(spec.file_list)
        wanted = (fields["text"], *self.chats)
        for s in range(reader.num_shards):
            keys = _first_keys(reader, s)
            media = sorted(set(keys or ()) & {"image", "images", "video", "videos"})
            if media:
                raise ConfigError(
                    f"{spec.file_list[s]}: its records have {', '.join(map(repr, media))}, "
                    "which format 'text' would ignore; name their format (llava for LLaVA "
                    "records, parquet for the Hub's Parquet with embedded images, messages, "
                    "obelics)")
            if keys is not None and not set(wanted) & set(keys):
                raise ConfigError(
                    f"{spec.file_list[s]}: its records do not fit format 'text': it needs "
                    f"{' or '.join(map(repr, wanted))}; saw keys {sorted(keys)[:20]}. Name "
                    f"the format these files have (known: {', '.join(known_formats())}), or "
                    f"map a renamed field: fields = {{ text = \"<key>\" }}")
        if fields["text"] != "text":
            return RenamedText(reader, fields["text"])
        return reader


def _first_keys(reader: Any, shard: int) -> list[str] | None:
    """Parquet columns, or the first record's keys; None for an empty file or a first
    record that is no object (it is dropped as a bad sample when drawn)."""
    from zephon_core.data.readers import ParquetReader

    if isinstance(reader, ParquetReader):
        import pyarrow.parquet as pq

        return list(pq.read_schema(reader.paths[shard]).names)
    if not reader.shard_len(shard):
        return None
    with open(reader.paths[shard], "rb") as f:
        head = f.read(4096).lstrip()[:1]
    if head == b"[":
        raise ConfigError(f"{reader.paths[shard]}: a JSON list, not JSON Lines: format 'text' "
                          "reads one record a line; name the list's format (llava, messages, "
                          "obelics read JSON lists)")
    try:
        first = reader.read(shard, 0)
    except ZephonError:
        return None
    return list(first) if isinstance(first, dict) else None


class RenamedText:
    """A text reader whose records keep their text under another key (``fields.text``)."""

    def __init__(self, reader: Any, key: str) -> None:
        self.reader = reader
        self.key = key

    @property
    def num_shards(self) -> int:
        return self.reader.num_shards

    def shard_len(self, shard: int) -> int:
        return self.reader.shard_len(shard)

    def shard_identity(self, shard: int) -> dict:
        return {**self.reader.shard_identity(shard), "fields": {"text": self.key}}

    def read(self, shard: int, index: int) -> Any:
        record = self.reader.read(shard, index)
        if isinstance(record, dict) and self.key in record:
            record = {**{k: v for k, v in record.items() if k != self.key},
                      "text": record[self.key]}
        return record


_FORMATS: dict[str, DataFormat | str] = {"text": "zephon_core.data.formats:TextFormat"}
#: a file suffix -> the format whose files (every file of a dataset) have it
_SUFFIXES: dict[str, str] = {}
#: a suffix -> the format one file of it (a dataset given as one path, not a list) indexes
_MANIFESTS: dict[str, str] = {}


def register_format(name: str, fmt: DataFormat | str, *, suffixes: Sequence[str] = (),
                    manifests: Sequence[str] = ()) -> None:
    """Make ``format = "<name>"`` build readers with `fmt` (an object, or ``"module:attr"``
    naming a class or an object, imported at first use).

    `suffixes` (``(".tar",)``): a dataset without a ``format`` whose files all end so is
    read as `name`; `manifests` (``(".json",)``): so is a dataset given as one such path.
    A suffix another format declared is taken over, as a name is.
    """
    ensure_plugins()   # a plugin's name never replaces one registered after it
    if not isinstance(fmt, (str, DataFormat)):
        raise ConfigError(f"register_format({name!r}) takes a format object or "
                          f"\"module:attr\"; {fmt!r} lacks {_lacks(fmt)} (see DataFormat)")
    _FORMATS[name] = fmt
    for table, given in ((_SUFFIXES, suffixes), (_MANIFESTS, manifests)):
        for suffix in given:
            if not suffix.startswith("."):
                raise ConfigError(f"register_format({name!r}): a suffix starts with a dot "
                                  f"('.tar'), got {suffix!r}")
            table[suffix.lower()] = name


def _lacks(fmt: Any) -> str:
    """The members of `DataFormat` that `fmt` lacks, for the error that refuses it."""
    members = ("name", "fields", "options", "path_options", "reads_folders", "reader")
    missing = [m for m in members if not hasattr(fmt, m)]
    return ", ".join(m if m != "reader" else "reader(spec, fields, index_cache)"
                     for m in missing) or "nothing (but is not a DataFormat)"


def known_formats() -> list[str]:
    """The registered dataset formats' names, sorted (built-in and plugins' alike): what a
    ``[[datasets]]`` table's ``format`` may name."""
    ensure_plugins()
    return sorted(_FORMATS)


def format_options() -> dict[str, list[str]]:
    """Each registered format's dataset options (``[[datasets]]`` keys besides the table's
    own), by format name: what a recipe file may set per dataset."""
    return {name: sorted(data_format(name).options) for name in known_formats()}


def data_format(name: str) -> DataFormat:
    """The format registered as `name`; ConfigError listing the known ones otherwise."""
    ensure_plugins()
    ref = _FORMATS.get(name) if isinstance(name, str) else None
    if ref is None:
        raise ConfigError(f"unknown dataset format {name!r}; known: "
                          f"{', '.join(known_formats())}{plugin_hint()}")
    if isinstance(ref, str):
        module, _, attr = ref.partition(":")
        try:
            obj = getattr(importlib.import_module(module), attr)
        except ImportError as exc:
            raise ConfigError(f"dataset format {name!r} needs {module}, which cannot be "
                              f"imported ({exc}); install the package that provides it") from None
        ref = obj() if isinstance(obj, type) else obj
        if not isinstance(ref, DataFormat):
            raise ConfigError(f"dataset format {name!r} ({_FORMATS[name]}) is not a format: "
                              f"it lacks {_lacks(ref)} (see DataFormat)")
        _FORMATS[name] = ref
    return ref


def default_format(files: Files | str) -> str:
    """The suffix rule: the format registered with the files' suffix (`register_format`'s
    `suffixes`, or `manifests` for one path), else ``text``."""
    ensure_plugins()
    if isinstance(files, (str, os.PathLike)):
        suffix = os.path.splitext(os.fspath(files))[1].lower()
        if suffix not in _MANIFESTS:
            known = ", ".join(f"{s} ({f})" for s, f in sorted(_MANIFESTS.items())) or "none"
            raise ConfigError(f"{os.fspath(files)!r}: a dataset is a list of files or one "
                              f"manifest; manifests known: {known}")
        return _MANIFESTS[suffix]
    suffixes = {os.path.splitext(os.fspath(f))[1].lower() for f in files}
    owned = sorted(s for s in suffixes if s in _SUFFIXES)
    if not owned:
        return "text"
    if len(suffixes) > 1:
        which = "each format's files" if len(owned) > 1 else "the text files"
        raise ConfigError(f"a dataset mixes {owned[0]} files (format "
                          f"{_SUFFIXES[owned[0]]!r}) with {sorted(suffixes - {owned[0]})} "
                          f"files; give {which} a dataset of their own")
    return _SUFFIXES[owned[0]]


def resolve_fields(fmt: DataFormat, overrides: Mapping[str, Any]) -> dict[str, str]:
    """The format's field table with `overrides`; an unknown field or a non-string is named."""
    if not isinstance(overrides, Mapping):
        raise ConfigError(f"fields of a {fmt.name!r} dataset must be a table of field = "
                          f"\"column\", got {overrides!r}")
    out = dict(fmt.fields)
    for key, value in overrides.items():
        if key not in out:
            known = ", ".join(sorted(out)) or "none (this format reads no renamable field)"
            raise ConfigError(f"unknown field {key!r} for format {fmt.name!r}; known: {known}")
        if not isinstance(value, str) or not value:
            raise ConfigError(f"field {key!r} of format {fmt.name!r} must name a key or "
                              f"column (a non-empty string), got {value!r}")
        out[key] = value
    return out


def as_spec(value: Any) -> DatasetSpec:
    """A dataset given as a `DatasetSpec`, a mapping ``{"files": [...], "format": ...,
    "fields": {...}, <option>: ...}``, a list of files or one manifest path."""
    if isinstance(value, DatasetSpec):
        return value
    if isinstance(value, Mapping):
        d = dict(value)
        if "files" not in d:
            raise ConfigError(f"a dataset table needs 'files', got keys {sorted(d)}")
        files = d.pop("files")
        fmt = d.pop("format", None)
        fields = d.pop("fields", None) or {}
        return DatasetSpec(files, fmt, fields, d)
    if isinstance(value, (str, os.PathLike)):
        return DatasetSpec(os.fspath(value))
    return DatasetSpec(list(value))


def dataset_format(value: Any) -> str:
    """The format a dataset is read as: its own ``format``, else the suffix rule."""
    spec = as_spec(value)
    return spec.format if spec.format is not None else default_format(spec.files)


def dataset_reader(value: Any, index_cache: str | None = None,
                   allowed: Sequence[str] | None = None) -> ShardReader:
    """The reader of one dataset (see `as_spec`), through its format.

    `allowed` limits the formats a recipe kind can train on (``text`` for the
    text kind); another is refused with the kinds that read it.
    """
    spec = as_spec(value)
    if not spec.file_list:
        raise ConfigError("a dataset needs at least one file")
    name = dataset_format(spec)
    fmt = data_format(name)
    folders = [f for f in spec.file_list if not is_remote(f) and os.path.isdir(f)]
    if folders and not fmt.reads_folders:
        raise ConfigError(f"{folders[0]!r} is a folder; a dataset lists its files "
                          "(.tar shards, .jsonl/.json or .parquet files), or one manifest "
                          "from `zephon-vl index`")
    if allowed is not None and name not in allowed:
        raise ConfigError(f"format {name!r} has images or videos; this recipe kind reads "
                          f"{', '.join(allowed)} only (use kind = \"vlm\")")
    fields = resolve_fields(fmt, spec.fields)
    unknown = sorted(set(spec.options) - set(fmt.options))
    if unknown:
        known = ", ".join(fmt.options) or "none"
        raise ConfigError(f"unknown option {unknown[0]!r} for a {name!r} dataset; its "
                          f"options: {known}")
    return fmt.reader(spec, fields, index_cache)


def option_path(spec: DatasetSpec, key: str) -> str | None:
    """A folder option (``image_folder``) as a string path or URL, or None when unset."""
    value = spec.options.get(key)
    if value is None:
        return None
    if not isinstance(value, (str, os.PathLike)):
        raise ConfigError(f"{key} must be a path or URL, got {value!r}")
    return os.fspath(value) if not isinstance(value, Path) else str(value)
