"""Record manifests: every record file's URL, size, identity, count and layout in one file.

Building a reader over JSON, JSONL or Parquet files stats each file and reads
its Parquet footer or JSON offset index: on object storage, thousands of
requests on every rank at start. A record manifest holds all of it in one
small file, written by ``zephon-vl index FILE_OR_URL... --format parquet --out
MANIFEST`` (`build_record_manifest`), as a shard manifest does for tar shards::

    {"format": "zephon-records-manifest", "version": 1, "records_format": "parquet",
     "files": [{"url": "s3://bucket/train-00000.parquet", "size": 73400320,
                "identity": "etag:9b2c...", "num_records": 4096,
                "row_groups": [1024, 1024, 1024, 1024], "keys": ["images", "texts"]}]}

A JSON or JSONL file's entry has ``keys`` (its first record's) and ``offsets``,
its offset index written to ``<manifest>.indexes/`` (relative to the
manifest, like the tar sidecars). A dataset then names the manifest with its
format (TOML ``manifest = "train.json"`` and ``format = "parquet"``); a file
whose size or identity changed is refused, naming it and the field, when it is
first opened; ``zephon-vl index --refresh MANIFEST`` re-indexes the changed
files (`refresh_record_manifest`).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from zephon_core import ConfigError
from zephon_core.extend import (
    atomic_write,
    base_name,
    is_remote,
    local_path,
    open_shard,
    stat_shard,
)
from zephon_vl.formats.records import RecordEntry, RecordFiles, offsets_blob
from zephon_vl.wds.manifest import (
    ShardChange,
    checked_location,
    index_folder,
    read_manifest,
    resolve_beside,
)

RECORDS_MANIFEST_FORMAT = "zephon-records-manifest"
RECORDS_MANIFEST_VERSION = 1
#: the formats whose files a record manifest indexes
RECORD_FORMATS = ("llava", "messages", "obelics", "parquet")
_HEAD = re.compile(rb'\s*\{\s*"format"\s*:\s*"' + RECORDS_MANIFEST_FORMAT.encode() + rb'"')


def is_record_manifest(location: str | os.PathLike) -> bool:
    """Whether `location` is a record manifest (its first bytes say so): a dataset given as
    one ``.json`` may be a LLaVA list as well, and that one is not read whole to tell."""
    text = os.fspath(location)
    try:
        if is_remote(text):
            stored = open_shard(text)
            try:
                head = stored.read_at(0, min(stored.size, 256))
            finally:
                stored.close()
        else:
            with open(local_path(text), "rb") as f:
                head = f.read(256)
    except (OSError, ValueError):
        return False
    return _HEAD.match(head) is not None


def _entry(i: int, location: str, out: Path, index_cache: str | None,
           media: Media = None) -> RecordEntry:
    """Index one file (stat, footer or offsets) and write its offset sidecar; with `media`
    (format name and folders), record the identity of the media its records name."""
    st = stat_shard(location)
    files = RecordFiles([location], index_cache)
    try:
        keys = files.keys_of_first(0)
    except Exception as exc:  # noqa: BLE001 - any unreadable first record is named
        raise ConfigError(f"{location}: its first record cannot be read ({exc})") from None
    found = _media_of(location, media, index_cache)
    if files.kinds[0] == "parquet":
        rows = np.diff(files.group_starts[0]).astype(int).tolist()
        return RecordEntry(location, st.size, st.identity, files.sizes[0], keys, rows,
                           media=found)
    rel = f"{index_folder(out).name}/{i:06d}-{base_name(location)}.zoffsets.json"
    atomic_write(out.parent / rel, offsets_blob(location, st.size, st.identity,
                                                files.offsets[0]))
    return RecordEntry(location, st.size, st.identity, files.sizes[0], keys, None, rel,
                       media=found)


#: what `zephon-vl index --image-folder/--video-folder` lists media for: the format's name
#: and the dataset's folder options (None: no media identity in the manifest)
Media = tuple[str, dict[str, str]] | None


def _media_of(location: str, media: Media, index_cache: str | None) -> dict | None:
    """The media identity of one record file's references, as a build would compute it
    for a dataset with these folders and the format's own field names."""
    if media is None:
        return None
    from zephon_core.extend import dataset_reader
    from zephon_vl.formats.media_identity import indexed_media

    name, folders = media
    reader = dataset_reader({"files": [location], "format": name, **folders}, index_cache)
    return indexed_media(reader, 0)  # type: ignore[arg-type]


def build_record_manifest(files: Sequence[str | os.PathLike], out: str | os.PathLike,
                          format_name: str, index_cache: str | None = None,
                          progress: Callable[[int], None] | None = None,
                          folders: dict[str, str] | None = None) -> list[RecordEntry]:
    """Index every record file of format `format_name` and write the manifest `out` (a
    local path); `progress` is called with the number of files indexed after each one.
    With `folders` (``image_folder``/``video_folder``, as the dataset will set them), each
    entry records the identity of the media its records name, so a build from the
    manifest stats none of them (`zephon_vl.formats.media_identity`)."""
    if format_name not in RECORD_FORMATS:
        raise ConfigError(f"zephon-vl index --format {format_name}: record manifests index "
                          f"{', '.join(RECORD_FORMATS)} files (webdataset: tar shards; a "
                          "text dataset lists its files)")
    out = Path(out)
    index_folder(out).mkdir(parents=True, exist_ok=True)
    entries = []
    media = (format_name, dict(folders)) if folders else None
    for i, f in enumerate(files):
        entries.append(_entry(i, checked_location(f), out, index_cache, media))
        if progress is not None:
            progress(i + 1)
    _write(out, format_name, entries)
    return entries


def _write(out: Path, format_name: str, entries: Sequence[RecordEntry]) -> None:
    """The manifest document; sidecar locations as `_entry` wrote them (relative)."""
    doc = {"format": RECORDS_MANIFEST_FORMAT, "version": RECORDS_MANIFEST_VERSION,
           "records_format": format_name,
           "files": [{k: v for k, v in (("url", e.url), ("size", e.size),
                                        ("identity", e.identity),
                                        ("num_records", e.num_records),
                                        ("row_groups", e.row_groups), ("keys", e.keys),
                                        ("offsets", e.offsets), ("media", e.media))
                      if v is not None}
                     for e in entries]}
    atomic_write(out, json.dumps(doc, indent=1))


def refresh_record_manifest(manifest: str | os.PathLike,
                            index_cache: str | None = None) -> list[ShardChange]:
    """Re-index the files of a local record `manifest` whose size or identity changed and
    rewrite their entries; unchanged files are only stat'ed, and where an entry records
    the identity of its media, those are listed again. Returns the changes (none: the
    manifest is left as it was)."""
    if is_remote(os.fspath(manifest)):
        raise ConfigError(f"{os.fspath(manifest)}: refresh a local copy of the manifest "
                          "(offset paths are relative to it), then upload it")
    path = Path(manifest)
    doc = _document(str(path))
    entries = load_record_manifest(path)
    written = [f.get("offsets") for f in doc["files"]]
    changes = []
    for i, entry in enumerate(entries):
        st = stat_shard(entry.url)
        media = _media_config(str(doc["records_format"]), entry.media)
        if (st.size, st.identity) == (entry.size, entry.identity):
            entries[i] = replace(entry, offsets=written[i])
            if media is not None:  # the records are the same; their media may not be
                entries[i] = replace(entries[i], media=_media_of(entry.url, media,
                                                                 index_cache))
        else:
            entries[i] = _entry(i, entry.url, path, index_cache, media)
        new = entries[i]
        changed = {f: (was, now) for f, was, now in (
            ("size", entry.size, new.size), ("identity", entry.identity, new.identity),
            ("num_records", entry.num_records, new.num_records),
            ("row_groups", entry.row_groups, new.row_groups),
            ("media", _digest(entry.media), _digest(new.media))) if was != now}
        if "media" in changed and _media_change(entry.media, new.media):
            changed["media"] = (changed["media"][0], f"{changed['media'][1]} "
                                f"({_media_change(entry.media, new.media)})")
        if changed:
            changes.append(ShardChange(entry.url, changed))
    if changes:
        _write(path, str(doc["records_format"]), entries)
    return changes


def _media_config(format_name: str, recorded: dict | None) -> Media:
    """How an entry's media identity was made (None: it has none), to make it again."""
    if not isinstance(recorded, dict):
        return None
    from zephon_vl.formats.media_identity import FOLDERS

    return format_name, {k: recorded[k] for k in FOLDERS if recorded.get(k) is not None}


def _digest(media: dict | None) -> str | None:
    return None if media is None else f"{media.get('files')} files, sha256 " \
        f"{str(media.get('sha256'))[:12]}"


def _media_change(was: dict | None, now: dict | None) -> str:
    """Which files changed between two media identities, when both listings are kept."""
    from zephon_vl.formats.media_identity import changed_files, recall_listing

    old = recall_listing(str((was or {}).get("sha256")))
    new = recall_listing(str((now or {}).get("sha256")))
    return changed_files(old, new) if old is not None and new is not None else ""


def _document(text: str) -> dict[str, Any]:
    return read_manifest(text, RECORDS_MANIFEST_FORMAT, RECORDS_MANIFEST_VERSION,
                         "zephon-vl index FILE... --format FORMAT --out MANIFEST")


def load_record_manifest(location: str | os.PathLike,
                         format_name: str | None = None) -> list[RecordEntry]:
    """The entries of a record manifest (a path or URL), offset sidecars made absolute;
    refused when it indexes files of another format than `format_name`."""
    text = os.fspath(location)
    doc = _document(text)
    indexed = doc.get("records_format")
    if format_name is not None and indexed != format_name:
        raise ConfigError(f"manifest {text} indexes {indexed} files, not {format_name}; set "
                          f"the dataset's format = \"{indexed}\" or index the files again "
                          f"with --format {format_name}")
    try:
        entries = [RecordEntry(str(f["url"]), int(f["size"]), str(f["identity"]),
                               int(f["num_records"]), [str(k) for k in f["keys"]],
                               [int(r) for r in f["row_groups"]] if "row_groups" in f
                               else None,
                               resolve_beside(text, str(f["offsets"])) if "offsets" in f
                               else None, f.get("media"))
                   for f in doc["files"]]
    except (KeyError, TypeError, ValueError) as e:
        raise ConfigError(f"manifest {text}: malformed file entry ({e!r})") from None
    if not entries:
        raise ConfigError(f"manifest {text} lists no files")
    return entries


def manifest_records_format(location: str | os.PathLike) -> str | None:
    """The format a record manifest indexes (None: `location` is no record manifest)."""
    if not is_record_manifest(location):
        return None
    return str(_document(os.fspath(location)).get("records_format"))
