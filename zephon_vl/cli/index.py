"""`zephon-vl index`: sidecar indexes and a manifest for shards on disk or object storage."""

from __future__ import annotations

import argparse
import time

from zephon_vl.cli.main import command


def _args(p: argparse.ArgumentParser) -> None:
    p.add_argument("shards", nargs="+", help="shard paths or URLs (s3://, gs://, https://...)")
    p.add_argument("--out", required=True, help="the manifest to write (a local .json path); "
                   "sidecar indexes go to the folder beside it named <manifest>.indexes")
    p.add_argument("--no-content-hash", action="store_true",
                   help="skip the SHA-256 of each shard's bytes (faster over slow storage; the "
                   "fingerprint then cannot catch an edit that keeps a shard's size)")


@command("index", "index WebDataset shards and write a dataset manifest", _args)
def cmd_index(args: argparse.Namespace) -> int:
    from zephon_vl.wds.manifest import build_manifest

    t0 = time.perf_counter()
    entries = build_manifest(args.shards, args.out, content_hash=not args.no_content_hash)
    samples = sum(e.num_samples for e in entries)
    size = sum(e.size for e in entries)
    print(f"{args.out}: {len(entries)} shards, {samples} samples, {size / 1e6:.1f} MB, "
          f"indexed in {time.perf_counter() - t0:.1f} s")
    return 0
