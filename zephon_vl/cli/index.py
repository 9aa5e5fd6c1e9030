"""`zephon-vl index`: sidecar indexes and a manifest for shards or record files (Parquet,
LLaVA JSON...) on disk or object storage, so that building a reader reads one file."""

from __future__ import annotations

import argparse
import time

from zephon_vl.cli.registry import command


def _args(p: argparse.ArgumentParser) -> None:
    p.add_argument("shards", nargs="*", help="shard (or, with --format, record file) paths "
                   "or URLs (s3://, gs://, https://...)")
    p.add_argument("--format", default="webdataset",
                   help="the files' dataset format: webdataset (tar shards, the default) or "
                   "a record format (parquet, llava, messages, obelics)")
    p.add_argument("--out", help="the manifest to write (a local .json path); "
                   "sidecar indexes go to the folder beside it named <manifest>.indexes")
    p.add_argument("--refresh", metavar="MANIFEST",
                   help="instead: re-index the shards (or record files) of this manifest "
                   "whose size or "
                   "ETag/mtime changed, rewrite their entries and name them")
    for kind in ("image", "video"):
        p.add_argument(f"--{kind}-folder", metavar="FOLDER",
                       help=f"with a record format: the dataset's {kind}_folder; each entry "
                       "then records the names, sizes and mtimes of the files its records "
                       "name there, so a build from the manifest stats none of them (their "
                       "changes are seen by --refresh)")
    p.add_argument("--no-content-hash", action="store_true",
                   help="skip the SHA-256 of each shard's bytes (faster over slow storage; the "
                   "fingerprint then cannot catch an edit that keeps a shard's size)")


@command("index", "index WebDataset shards and write a dataset manifest", _args)
def cmd_index(args: argparse.Namespace) -> int:
    from zephon_core import ConfigError
    from zephon_vl.wds.manifest import build_manifest

    if args.refresh:
        if args.shards or args.out:
            raise ConfigError("zephon-vl index: give either --refresh MANIFEST or "
                              "SHARD... --out MANIFEST, not both")
        return _refresh(args.refresh)
    if not args.shards or not args.out:
        raise ConfigError("zephon-vl index: give SHARD... --out MANIFEST (or --refresh "
                          "MANIFEST)")
    folders = {f"{k}_folder": _folder(getattr(args, f"{k}_folder"))
               for k in ("image", "video") if getattr(args, f"{k}_folder")}
    if args.format != "webdataset":
        return _records(args, folders)
    if folders:
        raise ConfigError("zephon-vl index: --image-folder and --video-folder are for record "
                          "formats (--format llava, parquet, messages, obelics)")
    from zephon_vl.cli.progress import Progress

    t0 = time.perf_counter()
    with Progress("zephon-vl index", len(args.shards), "shards") as progress:
        entries = build_manifest(args.shards, args.out, content_hash=not args.no_content_hash,
                                 progress=progress.update)
    samples = sum(e.num_samples for e in entries)
    size = sum(e.size for e in entries)
    print(f"{args.out}: {len(entries)} shards, {samples} samples, {size / 1e6:.1f} MB, "
          f"indexed in {time.perf_counter() - t0:.1f} s")
    return 0


def _folder(value: str) -> str:
    """A folder as a dataset resolves it (absolute), so a build finds the manifest's media
    identity made for its own folders; URLs as given."""
    from pathlib import Path

    from zephon_core.extend import is_remote

    return value if is_remote(value) else str(Path(value).resolve())


def _records(args: argparse.Namespace, folders: dict[str, str]) -> int:
    """A record manifest: each file's count, identity, row groups or offset index (and
    the identity of the media its records name in `folders`)."""
    from zephon_vl.cli.progress import Progress
    from zephon_vl.formats.manifest import build_record_manifest

    t0 = time.perf_counter()
    with Progress("zephon-vl index", len(args.shards), "files") as progress:
        entries = build_record_manifest(args.shards, args.out, args.format,
                                        progress=progress.update, folders=folders)
    records = sum(e.num_records for e in entries)
    size = sum(e.size for e in entries)
    media = sum(e.media.get("files", 0) for e in entries if e.media)
    print(f"{args.out}: {len(entries)} {args.format} files, {records} records, "
          f"{size / 1e6:.1f} MB" + (f", {media} media files listed" if folders else "")
          + f", indexed in {time.perf_counter() - t0:.1f} s")
    return 0


def _refresh(manifest: str) -> int:
    from zephon_vl.formats.manifest import is_record_manifest, refresh_record_manifest
    from zephon_vl.wds.manifest import refresh_manifest

    records = is_record_manifest(manifest)
    changes = refresh_record_manifest(manifest) if records else refresh_manifest(manifest)
    for change in changes:
        print(f"re-indexed {change.describe()}")
    print(f"{manifest}: {len(changes)} changed {'file' if records else 'shard'}(s) re-indexed"
          + ("; checkpoints of the old bytes will be refused by their fingerprint"
             if changes else ", nothing rewritten"))
    return 0
