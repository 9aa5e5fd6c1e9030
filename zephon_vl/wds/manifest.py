"""Dataset manifests: every shard's URL, size, identity, count and index in one file.

Building a Loader needs each shard's sample count (to place positions) and a
fingerprint (to refuse a resume on other data). Without a manifest that means
one sidecar read (or a full index) per shard on every rank; with one, it is a
single small file, whatever the number of shards. Written by
``zephon-vl index SHARD_OR_URL... --out MANIFEST``::

    {"format": "zephon-wds-manifest", "version": 1,
     "shards": [{"url": "s3://bucket/train/shard-000000.tar", "size": 1234567,
                 "identity": "etag:9b2cf535f27731c974343645a3985328",
                 "num_samples": 256, "sha256": "...",
                 "index": "manifest.indexes/000000-shard-000000.tar.zidx.json"}, ...]}

``index`` is relative to the manifest (or a full path/URL). A shard whose size
or identity no longer matches its entry is refused, naming the shard and the
field, the first time it is opened. To accept the new bytes, the user asks:
``zephon-vl index --refresh MANIFEST`` re-indexes only the changed shards and
rewrites their entries (`refresh_manifest`); a checkpoint of the old bytes is
then refused by its fingerprint.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from zephon_core import ConfigError
from zephon_core.extend import (
    atomic_write,
    base_name,
    is_remote,
    local_path,
    read_whole,
    stat_shard,
)
from zephon_vl.wds.index import ShardEntry, WebDatasetReader, load_index

MANIFEST_FORMAT = "zephon-wds-manifest"
MANIFEST_VERSION = 1


def checked_location(location: str | os.PathLike) -> str:
    """A URL as written (credentials in it refused), or a local path made absolute, so a
    manifest names each file the same wherever it is read."""
    text = os.fspath(location)
    if is_remote(text):
        if urlsplit(text).password is not None or "@" in urlsplit(text).netloc:
            raise ConfigError(f"{base_name(text)}: credentials in a URL are refused; configure "
                              "them the filesystem's usual way (for S3: AWS_* variables)")
        return text
    return str(local_path(text).resolve())


def index_folder(manifest: str | os.PathLike) -> Path:
    """Where `build_manifest` writes the sidecar indexes of `manifest`."""
    path = Path(manifest)
    return path.with_name(path.name.removesuffix(".json") + ".indexes")


def build_manifest(shards: Sequence[str | os.PathLike], out: str | os.PathLike,
                   content_hash: bool = True, retry: Any = None,
                   cache_dir: str | os.PathLike | None = None,
                   progress: Callable[[int], None] | None = None) -> list[ShardEntry]:
    """Index every shard (reusing valid sidecars) and write the manifest `out` (a local path).

    `progress` is called with the number of shards indexed so far after each one.
    """
    out = Path(out)
    folder = index_folder(out)
    folder.mkdir(parents=True, exist_ok=True)
    entries = []
    for i, shard in enumerate(shards):
        location = checked_location(shard)
        idx = load_index(location, cache_dir, content_hash, retry)
        rel = f"{folder.name}/{i:06d}-{idx.name}.zidx.json"
        atomic_write(out.parent / rel, json.dumps(idx.to_json(), separators=(",", ":")))
        entries.append(ShardEntry(location, idx.size, idx.identity, len(idx), idx.sha256, rel))
        if progress is not None:
            progress(i + 1)
    atomic_write(out, json.dumps(_document(entries), indent=1))
    return entries


def _document(entries: Sequence[ShardEntry]) -> dict[str, Any]:
    return {"format": MANIFEST_FORMAT, "version": MANIFEST_VERSION,
            "shards": [{"url": e.url, "size": e.size, "identity": e.identity,
                        "num_samples": e.num_samples, "sha256": e.sha256, "index": e.index}
                       for e in entries]}


@dataclass(frozen=True)
class ShardChange:
    """One shard that `refresh_manifest` re-indexed: what differed from its old entry."""

    url: str
    fields: dict[str, tuple[Any, Any]]  # field -> (in the manifest, now)

    def describe(self) -> str:
        return f"{base_name(self.url)}: " + ", ".join(
            f"{f} {was} -> {now}" for f, (was, now) in self.fields.items())


def refresh_manifest(manifest: str | os.PathLike, retry: Any = None,
                     cache_dir: str | os.PathLike | None = None) -> list[ShardChange]:
    """Re-index the shards of a local `manifest` whose size or identity changed, and rewrite
    their entries; unchanged shards are only stat'ed. Returns the changes (none: the file is
    left as it was)."""
    path = Path(manifest)
    if is_remote(os.fspath(manifest)):
        raise ConfigError(f"{os.fspath(manifest)}: refresh a local copy of the manifest "
                          "(index paths are relative to it), then upload it")
    entries = load_manifest(path, retry)
    raw = json.loads(path.read_text())["shards"]
    folder = index_folder(path)
    changes = []
    for i, (entry, written) in enumerate(zip(entries, raw, strict=True)):
        st = stat_shard(entry.url, retry)
        fields = {f: (was, now) for f, was, now in (("size", entry.size, st.size),
                                                    ("identity", entry.identity, st.identity))
                  if was != now}
        if not fields:
            continue
        idx = load_index(entry.url, cache_dir, entry.sha256 is not None, retry)
        for f, was, now in (("num_samples", entry.num_samples, len(idx)),
                            ("sha256", entry.sha256, idx.sha256)):
            if was != now:
                fields[f] = (was, now)
        rel = str(written["index"])
        if is_remote(rel) or Path(rel).is_absolute():
            rel = f"{folder.name}/{i:06d}-{idx.name}.zidx.json"
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write(path.parent / rel, json.dumps(idx.to_json(), separators=(",", ":")))
        raw[i] = {"url": entry.url, "size": idx.size, "identity": idx.identity,
                  "num_samples": len(idx), "sha256": idx.sha256, "index": rel}
        changes.append(ShardChange(entry.url, fields))
    if changes:
        atomic_write(path, json.dumps({"format": MANIFEST_FORMAT, "version": MANIFEST_VERSION,
                                       "shards": raw}, indent=1))
    return changes


def resolve_beside(manifest: str, rel: str) -> str:
    """`rel` (a sidecar a manifest names) relative to the manifest's folder or URL."""
    if is_remote(rel) or Path(rel).is_absolute():
        return rel
    if is_remote(manifest):
        return manifest.rsplit("/", 1)[0] + "/" + rel
    return str(local_path(manifest).parent / rel)


def read_manifest(text: str, tag: str, version: int, usage: str,
                  retry: Any = None) -> dict[str, Any]:
    """A manifest's JSON document, refused unless it is `tag` at `version`; `usage` is the
    ``zephon-vl index`` command line that writes one (for the errors)."""
    try:
        doc = json.loads(read_whole(text, retry))
    except FileNotFoundError:
        raise ConfigError(f"manifest {text} does not exist; write it with {usage}") from None
    except (OSError, ValueError) as e:
        raise ConfigError(f"manifest {text} is unreadable ({e}); write it again with "
                          "zephon-vl index") from None
    if not isinstance(doc, dict) or doc.get("format") != tag or doc.get("version") != version:
        raise ConfigError(f"{text} is not a {tag} manifest of version {version}")
    return doc


def load_manifest(location: str | os.PathLike, retry: Any = None) -> list[ShardEntry]:
    """The entries of a manifest (a path or URL), index locations made absolute."""
    text = os.fspath(location)
    doc = read_manifest(text, MANIFEST_FORMAT, MANIFEST_VERSION,
                        "zephon-vl index SHARD... --out MANIFEST", retry)
    try:
        return [ShardEntry(str(s["url"]), int(s["size"]), str(s["identity"]),
                           int(s["num_samples"]), s.get("sha256"),
                           resolve_beside(text, str(s["index"])))
                for s in doc["shards"]]
    except (KeyError, TypeError, ValueError) as e:
        raise ConfigError(f"manifest {text}: malformed shard entry ({e!r})") from None


def reader_from_manifest(location: str | os.PathLike, **options: Any) -> WebDatasetReader:
    """A `WebDatasetReader` whose lengths and fingerprint come from the manifest alone."""
    entries = load_manifest(location)
    if not entries:
        raise ConfigError(f"manifest {os.fspath(location)} lists no shards")
    return WebDatasetReader([e.url for e in entries], entries=entries, **options)
