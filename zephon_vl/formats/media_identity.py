"""The identity of the media a record file names, for checkpoint fingerprints.

A record (a LLaVA line, an OBELICS document) names its images by path; their
pixels are read when the record is, so a resume against other pixels under the
same names would be accepted, then give other batches (or fail while the
restore recomputes the rows it holds). Each record file's `shard_identity`
therefore carries ``media``::

    {"image_folder": "/data/coco", "video_folder": null,
     "files": 118287, "sha256": "<names, sizes and mtimes of those files>"}

and a resume whose media differ is refused naming the dataset, the record file
and, through `explain_change`, the files that changed (DESIGN guarantee 6).

What it costs, and how it is kept low:

- the *names* need one scan of the record file's records (`to_sample`, which
  only parses text; Parquet is read without its ``bytes`` columns, so no
  embedded pixels). They depend only on the record file's bytes, so they are
  cached beside it (``<file>.zmedia.json``, or in ``index_cache``), keyed by its
  size and identity, format and field map, as the JSON offset index is;
- the *sizes and mtimes* are one ``stat`` per distinct local file, at each
  build (so a change is seen), never a read of the file;
- a record manifest made with ``zephon-vl index --image-folder`` holds the
  identity already, and a build from it stats nothing (`manifest_media`);
- media under a URL prefix are identified by the prefix only (a ``HEAD`` per
  object would cost more than the build); embedded media are part of the
  record file, whose size is in its identity already.

A name is listed with the path it resolves to. A Parquet image entry
(``{"bytes", "path"}``) is listed by its path even when it carries bytes (the
scan does not read them), which can only refuse more, never accept other
pixels. Only datasets with a local folder list files (absolute paths their
records name included); a relative reference without the folder it needs is not
listed (it is refused where references are checked). Each listing is also kept
under the cache folder by its digest, so a refusal can name the files that
changed since the checkpoint's listing was made on this machine.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zephon_core import BadSampleError
from zephon_core.extend import atomic_write, base_name, cache_dir, is_remote, local_path, stat_shard
from zephon_vl.formats.records import Where

if TYPE_CHECKING:
    from zephon_vl.formats.base import FormatReader
    from zephon_vl.formats.records import RecordFiles
    from zephon_vl.formats.references import MediaPlaces

log = logging.getLogger(__name__)

MEDIA_SUFFIX = ".zmedia.json"
MEDIA_VERSION = 1
#: listings kept under the cache folder (the newest), to name what changed at a refusal
KEEP_LISTINGS = 64
#: a refusal names this many changed files, then counts the rest
NAMED_CHANGES = 3
#: the dataset options a record's media references resolve in
FOLDERS = ("image_folder", "video_folder")

#: a listing: resolved location -> [size, mtime_ns], or None where no file is
Listing = dict[str, list[int] | None]


def has_local_folder(folders: dict[str, str | None]) -> bool:
    return any(f is not None and not is_remote(f) for f in folders.values())


def shard_media(reader: FormatReader, shard: int) -> dict:
    """Record file `shard`'s ``media`` identity (see the module docstring): the folders,
    and where one is a local folder, the count and digest of the files its records name
    (from its manifest entry when that recorded them for these folders and fields)."""
    folders = {k: reader.folders.get(k) for k in FOLDERS}
    if not has_local_folder(folders):
        return folders  # URL prefixes (or none): the prefix is the identity
    entries = reader.records.entries
    if entries is not None:
        found = manifest_media(entries[shard].media, folders, reader.fields)
        if found is not None:
            return found
    listing = stat_listing(record_refs(reader, shard), reader.places)
    identity = media_identity(folders, listing)
    remember_listing(identity["sha256"], listing)
    return identity


def media_identity(folders: dict[str, str | None], listing: Listing) -> dict:
    """The ``media`` of a shard identity: its folders, and the count and SHA-256 of the
    sorted listing (so the same files give the same digest in any order named)."""
    body = json.dumps(sorted(listing.items()), separators=(",", ":")).encode()
    return {**{k: folders.get(k) for k in FOLDERS},
            "files": len(listing), "sha256": hashlib.sha256(body).hexdigest()}


def stat_listing(refs: list[list], places: MediaPlaces) -> Listing:
    """Size and mtime of every local file `refs` (``[ref, video]`` pairs) resolve to.

    References are located by the reader's own rule (`MediaPlaces.locate`), so the listing
    holds exactly the files a run may read; one the rule refuses is a drop, never read,
    and has no place in the identity."""
    out: Listing = {}
    for ref, video in refs:
        try:
            location = places.locate(ref, bool(video), "media identity")
        except BadSampleError:
            continue
        if is_remote(location) or location in out:
            continue
        try:
            st = os.stat(location)
        except (OSError, ValueError):  # absent, a path through a file, too long
            out[location] = None
            continue
        out[location] = [st.st_size, st.st_mtime_ns]
    return out


# ---- the names: one scan of the record file, cached by its identity ---------------------

def record_refs(reader: FormatReader, shard: int) -> list[list]:
    """``[ref, video]`` of every media reference of file `shard`'s records, each once, in
    the order first named: from the cache beside the file when it describes these bytes."""
    records = reader.records
    location = records.files[shard]
    st = stat_shard(location)
    key = {"version": MEDIA_VERSION, "file": base_name(location), "size": st.size,
           "identity": st.identity, "format": reader.format.name,
           "fields": dict(sorted(reader.fields.items()))}
    paths = _refs_cache(location, reader.index_cache)
    for p in paths:
        try:
            doc = json.loads(p.read_text())
            if {k: doc.get(k) for k in key} == key:
                return [[str(r), bool(v)] for r, v in doc["refs"]]
        except FileNotFoundError:
            continue
        except (OSError, ValueError, KeyError, TypeError) as e:
            log.info("ignoring unusable media names cache %s (%s); scanning again", p, e)
    refs = scan_refs(reader, shard)
    try:
        atomic_write(paths[0], json.dumps({**key, "refs": refs}, separators=(",", ":")))
    except OSError as e:
        log.info("cannot write the media names cache %s (%s): the next build scans %s "
                 "again; give the recipe an index_cache folder", paths[0], e, location)
    return refs


def _refs_cache(location: str, index_cache: str | None) -> list[Path]:
    """Where a file's media names are looked for; the first is where they are written."""
    name = base_name(location)
    digest = hashlib.sha256(os.fspath(location).encode()).hexdigest()[:16]
    if is_remote(location):
        folder = Path(index_cache) if index_cache else cache_dir() / "record-index"
        return [folder / f"{name}.{digest}{MEDIA_SUFFIX}"]
    beside = local_path(location).with_name(name + MEDIA_SUFFIX)
    return [beside] if index_cache is None else [
        Path(index_cache) / f"{name}.{digest}{MEDIA_SUFFIX}", beside]


def scan_refs(reader: FormatReader, shard: int) -> list[list]:
    """Every record of file `shard` through its format's `to_sample` (text only); a record
    that does not fit is skipped: its read drops it, and it reads no media."""
    records = reader.records
    name = base_name(records.files[shard])
    rows = (_parquet_rows(records, shard) if records.kinds[shard] == "parquet"
            else _json_rows(records, shard))
    seen: dict[tuple[str, bool], None] = {}
    for i, record in enumerate(rows):
        if not isinstance(record, dict):
            continue
        try:
            sample = reader.format.to_sample(record, reader.fields, Where(name, i, str(i)))
        except BadSampleError:
            continue
        for item in sample["media"]:
            if "ref" in item:
                seen.setdefault((str(item["ref"]), bool(item["video"])), None)
    return [[ref, video] for ref, video in seen]


def _json_rows(records: RecordFiles, shard: int) -> Iterator[Any]:
    for i in range(records.sizes[shard]):
        try:
            yield records.read(shard, i)
        except BadSampleError:  # not JSON: dropped at read
            yield None


def _parquet_rows(records: RecordFiles, shard: int) -> Iterator[Any]:
    """The rows of a Parquet file without its embedded bytes: every leaf column but the
    ``bytes`` of a ``{bytes, path}`` struct (the ``Image`` feature)."""
    pf = records.parquet_file(shard)
    leaves = [pf.schema.column(i).path for i in range(len(pf.schema))]
    kept = [p for p in leaves if not (p.endswith(".bytes") and p[:-6] + ".path" in leaves)]
    for g in range(pf.num_row_groups):
        for row in pf.read_row_group(g, columns=kept).to_pylist():
            yield _unbytes(row)


def _unbytes(value: Any) -> Any:
    """An ``Image`` struct read without ``bytes`` is ``{"path": p}``: a path names a file
    (listed, see the module docstring); no path means bytes were there."""
    if isinstance(value, dict):
        if value.keys() == {"path"}:
            return {"bytes": None if value["path"] else b"\0", "path": value["path"]}
        return {k: _unbytes(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_unbytes(v) for v in value]
    return value


# ---- listings kept by digest, to name what changed ---------------------------------------

def _listings() -> Path:
    return cache_dir() / "media-listings"


def remember_listing(digest: str, listing: Listing) -> None:
    """Keep `listing` under its digest (once), and only the newest `KEEP_LISTINGS`."""
    folder = _listings()
    path = folder / f"{digest}.json"
    try:
        if path.exists():
            os.utime(path)
            return
        atomic_write(path, json.dumps(listing, separators=(",", ":")))
        kept = sorted(folder.glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True)
        for old in kept[KEEP_LISTINGS:]:
            old.unlink(missing_ok=True)
    except OSError as e:
        log.info("cannot keep the media listing %s (%s): a refused resume will not name the "
                 "files that changed", path, e)


def recall_listing(digest: str) -> Listing | None:
    try:
        found = json.loads((_listings() / f"{digest}.json").read_text())
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def _when(entry: list[int] | None) -> str:
    if entry is None:
        return "absent"
    stamp = datetime.datetime.fromtimestamp(entry[1] / 1e9).isoformat(timespec="seconds")
    return f"{entry[0]} bytes, modified {stamp}"


def explain_change(reader: FormatReader, shard: int, recorded: dict) -> str | None:
    """What changed in the media of file `shard` since its identity was `recorded` (a
    clause for the refusal), or None when its media are not what differs."""
    theirs = recorded.get("media") if isinstance(recorded, dict) else None
    ours = reader.media_identity(shard)
    if not isinstance(theirs, dict) or theirs.get("sha256") == ours.get("sha256"):
        return None
    if any(theirs.get(k) != ours.get(k) for k in FOLDERS):
        return None  # the folder itself is named by the difference
    now = stat_listing(record_refs(reader, shard), reader.places)
    old = recall_listing(str(theirs.get("sha256")))
    what = f"the media named by {base_name(reader.records.files[shard])} changed since the " \
           "checkpoint"
    if old is None:
        return (f"{what} ({theirs.get('files')} files then, {len(now)} now; the checkpoint's "
                f"listing is not under {_listings()}, so the files cannot be named)")
    return f"{what}: {changed_files(old, now)}"


def changed_files(old: Listing, now: Listing) -> str:
    """The files whose size or mtime differ between two listings (the first few named)."""
    changed = [loc for loc in sorted(set(old) | set(now)) if old.get(loc) != now.get(loc)]
    named = "; ".join(f"{loc}: {_when(old.get(loc))} then, {_when(now.get(loc))} now"
                      for loc in changed[:NAMED_CHANGES])
    more = f" (and {len(changed) - NAMED_CHANGES} more)" if len(changed) > NAMED_CHANGES else ""
    return f"{named}{more}" if changed else "no file differs"


def manifest_media(recorded: Any, folders: dict[str, str | None],
                   fields: dict[str, str]) -> dict | None:
    """The identity a record manifest's entry holds (`zephon-vl index --image-folder`),
    when it was made for these folders and field map (None: list the files here)."""
    if not (isinstance(recorded, dict) and recorded.get("fields") == dict(sorted(
            fields.items())) and all(recorded.get(k) == folders.get(k) for k in FOLDERS)
            and isinstance(recorded.get("files"), int)
            and isinstance(recorded.get("sha256"), str)):
        return None
    return {k: recorded[k] for k in (*FOLDERS, "files", "sha256")}


def indexed_media(reader: FormatReader, shard: int) -> dict:
    """What a record manifest's entry records about the media of file `shard`: its
    identity, listed now, and the field map it holds for."""
    return {**shard_media(reader, shard), "fields": dict(sorted(reader.fields.items()))}
