"""What every record format shares: zephon's sample model and the reader that makes it.

A format maps one record of its files to a *sample*, a plain dict::

    {"__format__": "llava", "__key__": "000123", "__shard__": "llava.json",
     "kind": "conversation",                       # or "interleaved"
     "turns": [{"role": "user", "content": ["", None, "\\nWhat is it?"]},
               {"role": "assistant", "content": ["A cat."]}],
     # "parts": ["text", None, "more text"]        # for "interleaved"
     "media": [{"video": False, "data": b"<jpeg bytes>", "name": "coco/1.jpg"}]}

``None`` in a turn's content (or in ``parts``) is where the next item of
``media`` goes, so images sit where their placeholders are. Roles are
``system``, ``user`` and ``assistant``; only assistant turns are trained.
`DecodeVision` decodes the media into patches; `TokenizeMultimodal` frames
the turns the model family's way (see `zephon_vl.ops.multimodal`).

The mapping runs inside `Read` (a pure function of the record), so a record
that does not fit its format is a drop whose reason says why (``bad_record``
for a missing or mistyped field, ``placeholder_mismatch``, ``bad_role``,
``missing_media``), with the record's file and key. Where a record's media
may point, and how much of a file is read, is `zephon_vl.formats.references`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

from zephon_core import BadSampleError, ConfigError, DatasetSpec
from zephon_core.extend import ROLES, base_name, known_formats, later_shard_field, option_path
from zephon_vl.formats.inline import decode_inline, inline_item, is_data_url
from zephon_vl.formats.records import ROW_GROUP_CACHE, RecordEntry, RecordFiles, Where
from zephon_vl.formats.references import OPTIONS as REFERENCE_OPTIONS
from zephon_vl.formats.references import MediaPlaces

#: placeholders a text may carry for the next image or video of its record
PLACEHOLDER = re.compile(r"<image>|<video>")
#: a record file's shard identity names the media its records name (`media_identity`);
#: a checkpoint written before 0.4.0 lacks it and still restores, with a warning
MEDIA = later_shard_field("media", since="0.4.0", covers=(
    "the media its records name (image_folder, video_folder, names, sizes and mtimes of "
    "the files)"))


def bad(where: Where, detail: str, reason: str = "bad_record") -> BadSampleError:
    return BadSampleError(reason, str(where), detail)


def field_value(record: dict, fields: Mapping[str, str], name: str) -> Any:
    """The record's value of the format's field `name` (None when absent)."""
    return record.get(fields[name])


def role_of(raw: Any, where: Where) -> str:
    role = ROLES.get(raw) if isinstance(raw, str) else None
    if role is None:
        raise bad(where, f"role {raw!r} is none of {', '.join(sorted(ROLES))}", "bad_role")
    return role


def split_text(text: str) -> tuple[list[str | None], list[str]]:
    """A text with ``<image>``/``<video>`` placeholders -> pieces (None where one was) and
    the placeholders found, in order."""
    pieces: list[str | None] = []
    found: list[str] = []
    pos = 0
    for m in PLACEHOLDER.finditer(text):
        pieces += [text[pos:m.start()], None]
        found.append(m.group(0))
        pos = m.end()
    pieces.append(text[pos:])
    return pieces, found


def as_list(value: Any) -> list:
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]


def check_conversation(turns: list[dict], where: Where) -> None:
    """A chat with nothing to train on would only teach ``<|endoftext|>``: refuse it."""
    if not any(t["role"] == "assistant" and any(p for p in t["content"] if p) for t in turns):
        raise bad(where, "a conversation without an assistant turn (with text) has nothing "
                  "to train on", "no_assistant_turn")


class RecordFormat:
    """Base of the record formats: subclasses set `name`, `fields`, `options`, `required`
    and write `to_sample`; this class builds the reader and checks each file."""

    name = ""
    fields: Mapping[str, str] = {}
    options: tuple[str, ...] = ("image_folder", "video_folder", "row_group_cache",
                                *REFERENCE_OPTIONS)
    path_options: tuple[str, ...] = ("image_folder", "video_folder", "allow_references")
    #: a dataset's files are files (the container formats, whose datasets are folders, say True)
    reads_folders = False
    #: alternatives of fields a record must have (each a tuple: one of them is enough)
    required: tuple[tuple[str, ...], ...] = ()

    def reader(self, spec: DatasetSpec, fields: Mapping[str, str],
               index_cache: str | None) -> FormatReader:
        cache = spec.options.get("row_group_cache", ROW_GROUP_CACHE)
        if not isinstance(cache, int) or cache < 1:
            raise ConfigError(f"row_group_cache must be a positive integer, got {cache!r}")
        records = RecordFiles(spec.file_list, index_cache, cache,
                              entries=self.manifest_entries(spec))
        self.check_files(records, fields)
        folders = {k: option_path(spec, k) for k in ("image_folder", "video_folder")}
        places = MediaPlaces(folders, spec.options)
        self.check_first_references(records, fields, places)
        return FormatReader(self, dict(fields), records, folders, places, index_cache)

    def manifest_entries(self, spec: DatasetSpec) -> list[RecordEntry] | None:
        """The entries of the record manifest a dataset names as its one file (None: its
        files are the data, e.g. one LLaVA ``.json``)."""
        if not isinstance(spec.files, (str, os.PathLike)):
            return None
        from zephon_vl.formats.manifest import is_record_manifest, load_record_manifest

        if not is_record_manifest(spec.files):
            return None
        return load_record_manifest(spec.files, self.name)

    def missing(self, keys: set[str], fields: Mapping[str, str]) -> tuple[str, str] | None:
        """Why records with `keys` do not fit, and the field to map (None when they fit)."""
        for alternatives in self.required:
            if not any(fields[a] in keys for a in alternatives):
                names = " or ".join(repr(fields[a]) for a in alternatives)
                return f"needs {names}", alternatives[0]
        return None

    def check_files(self, records: RecordFiles, fields: Mapping[str, str]) -> None:
        """Refuse a file whose records (its first one, or its Parquet columns) do not fit."""
        for s in range(len(records)):
            if not records.sizes[s]:
                continue
            try:
                keys = records.keys_of_first(s)
            except BadSampleError as exc:
                raise ConfigError(f"{records.files[s]}: its first record cannot be read as "
                                  f"format {self.name!r}: {exc}") from None
            found = self.missing(set(keys), fields)
            if found is not None:
                why, field_name = found
                raise ConfigError(
                    f"{records.files[s]}: its records do not fit format {self.name!r}: it "
                    f"{why}; saw keys {keys[:20]}. Name the format these files have "
                    f"(known: {', '.join(known_formats())}), or map a renamed field: "
                    f"fields = {{ {field_name} = \"<key>\" }}")

    def check_first_references(self, records: RecordFiles, fields: Mapping[str, str],
                               places: MediaPlaces) -> None:
        """Refuse a JSON file whose first record names a relative path the dataset has no
        folder for: every such record would be dropped, so say which option to set now.
        (Parquet files and manifests are not read here: building opens no row group; their
        records are ``reference_without_folder`` drops.)"""
        if records.entries is not None or None not in places.folders.values():
            return
        for s in range(len(records)):
            if not records.sizes[s] or records.kinds[s] == "parquet":
                continue
            where = Where(base_name(records.files[s]), 0, "0")
            try:
                record = records.read(s, 0)
                media = self.to_sample(record, fields, where)["media"] \
                    if isinstance(record, dict) else []
            except BadSampleError:
                continue  # a bad first record is its own drop
            for item in media:
                if "ref" in item and places.needs_folder(item["ref"], item["video"]):
                    kind = "video" if item["video"] else "image"
                    raise ConfigError(f"{records.files[s]}: its first record names "
                                      + places.no_folder(item["ref"], kind))

    def to_sample(self, record: dict, fields: Mapping[str, str], where: Where) -> dict:
        """The record as a sample (see the module docstring); ``media`` holds references
        (`media_item`) that the reader resolves to bytes."""
        raise NotImplementedError

    def key_of(self, record: Any, fields: Mapping[str, str], index: int) -> str:
        if "id" in fields and isinstance(record, dict):
            value = record.get(fields["id"])
            if isinstance(value, (str, int)) and not isinstance(value, bool):
                return str(value)[:80]
        return str(index)


def media_item(ref: Any, video: bool, where: Where, label: str | None = None) -> dict:
    """A media reference of a record: a path or URL, raw bytes, the Hugging Face
    ``Image`` struct ``{"bytes": ..., "path": ...}``, or a base64 ``data:`` URL (decoded
    when the media are loaded, `zephon_vl.formats.inline`). `label` names the place in
    the record for a data URL's drop details (default: the record's image/video)."""
    if isinstance(ref, dict):
        data, path = ref.get("bytes"), ref.get("path")
        if isinstance(data, (bytes, bytearray)) and data:
            return {"video": video, "data": bytes(data), "name": str(path or "embedded")}
        if isinstance(path, str) and path:
            return media_item(path, video, where, label)
        raise bad(where, f"a media entry has neither bytes nor a path: {str(ref)[:80]}")
    if isinstance(ref, (bytes, bytearray)) and ref:
        return {"video": video, "data": bytes(ref), "name": "embedded"}
    if is_data_url(ref):
        return inline_item(ref, video, where,
                           label or f"the record's {'video' if video else 'image'}")
    if isinstance(ref, str) and ref:
        return {"video": video, "ref": ref}
    raise bad(where, f"a media entry is {type(ref).__name__} {str(ref)[:60]!r}, not a path, "
              "bytes or {'bytes', 'path'}")


class FormatReader:
    """A `ShardReader` over a format's record files: each read is one sample with its
    media bytes (images and videos named by path are read here, through the storage seam,
    where `places` allows and within its bounds)."""

    def __init__(self, fmt: RecordFormat, fields: dict[str, str], records: RecordFiles,
                 folders: dict[str, str | None], places: MediaPlaces | None = None,
                 index_cache: str | None = None) -> None:
        self.format = fmt
        self.fields = fields
        self.records = records
        self.folders = folders
        self.places = places if places is not None else MediaPlaces(folders, {})
        self.index_cache = index_cache
        self._media: dict[int, dict] = {}

    @property
    def num_shards(self) -> int:
        return len(self.records)

    def shard_len(self, shard: int) -> int:
        return self.records.sizes[shard]

    def shard_identity(self, shard: int) -> dict:
        identity = {**self.records.shard_identity(shard), "format": self.format.name,
                    "fields": dict(sorted(self.fields.items())),
                    MEDIA: self.media_identity(shard)}
        if self.places.policy:  # only where set: fingerprints without it stay as they were
            identity["media_policy"] = self.places.policy
        return identity

    def media_identity(self, shard: int) -> dict:
        """The folders and the identity of the files file `shard`'s records name (see
        `zephon_vl.formats.media_identity`), computed once per reader: once per build."""
        found = self._media.get(shard)
        if found is None:
            from zephon_vl.formats.media_identity import shard_media

            found = self._media[shard] = shard_media(self, shard)
        return found

    def identity_change(self, shard: int, recorded: dict) -> str | None:
        """`ExplainsChanges`: the media files that changed since `recorded` was made."""
        from zephon_vl.formats.media_identity import explain_change

        return explain_change(self, shard, recorded)

    def key(self, shard: int, index: int) -> str:
        """``file:key`` of a record, as its drops and errors name it (for the ledger: JSON
        reads the one record; Parquet reads only the row group's ``id`` column)."""
        name = base_name(self.records.files[shard])
        try:
            if "id" in self.fields and self.records.kinds[shard] == "parquet":
                record = self.records.read_column(shard, index, self.fields["id"])
            else:
                record = self.records.read(shard, index)
        except BadSampleError:  # a record that is no JSON: named by its position
            record = None
        return f"{name}:{self.format.key_of(record, self.fields, index)}"

    def read(self, shard: int, index: int) -> dict:
        return self._sample(shard, index, self.records.read(shard, index))

    def read_many(self, pointers: list[tuple[int, int]]) -> list[dict]:
        """`read` of a group at once (`ReadsMany`): each Parquet row group read once."""
        records = self.records.read_many(pointers)
        return [self._sample(s, i, r) for (s, i), r in zip(pointers, records, strict=True)]

    def _sample(self, shard: int, index: int, record: Any) -> dict:
        name = base_name(self.records.files[shard])
        where = Where(name, index, self.format.key_of(record, self.fields, index))
        if not isinstance(record, dict):
            raise bad(where, f"a record is a {type(record).__name__}, not an object")
        sample = self.format.to_sample(record, self.fields, where)
        sample["media"] = [self._load(m, where) for m in sample["media"]]
        return {"__format__": self.format.name, "__key__": where.key, "__shard__": name,
                **sample}

    def _load(self, item: dict, where: Where) -> dict:
        if "data" in item:
            return item
        if "inline" in item:
            data = decode_inline(item, self.places.limits[item["video"]], where)
            return {"video": item["video"], "data": data, "name": item["name"]}
        location = self.places.locate(item["ref"], item["video"], where)
        data = self.places.read(location, item["video"], where)
        return {"video": item["video"], "data": data, "name": item["ref"]}


def place_media(found: list[str], images: list[dict], videos: list[dict],
                where: Where) -> list[dict]:
    """The media in placeholder order: ``<video>`` takes the next video, ``<image>`` the
    next image (or the next video when the record has none, as LLaVA-Video writes it)."""
    out: list[dict] = []
    queues = {"<image>": list(images), "<video>": list(videos)}
    if not images:
        queues["<image>"] = queues["<video>"]
    for token in found:
        queue = queues[token]
        if not queue:
            raise bad(where, f"{found.count('<image>')} <image> and {found.count('<video>')} "
                      f"<video> placeholders for {len(images)} image(s) and {len(videos)} "
                      "video(s)", "placeholder_mismatch")
        out.append(queue.pop(0))
    left = len(queues["<image>"]) + (len(queues["<video>"])
                                      if queues["<video>"] is not queues["<image>"] else 0)
    if left:
        raise bad(where, f"{found.count('<image>')} <image> and {found.count('<video>')} "
                  f"<video> placeholders for {len(images)} image(s) and {len(videos)} "
                  "video(s)", "placeholder_mismatch")
    return out


def conversation(turns: list[dict], media: list[dict], where: Where) -> dict:
    check_conversation(turns, where)
    return {"kind": "conversation", "turns": turns, "media": media}

