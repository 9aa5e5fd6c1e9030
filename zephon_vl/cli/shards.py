"""`zephon-vl shards`: WebDataset shards from a folder of images and captions."""

from __future__ import annotations

import argparse
import sys

from zephon_vl.cli.registry import command


def _args(p: argparse.ArgumentParser) -> None:
    p.add_argument("folder", help="images (jpg, png, webp, gif, bmp, tiff) with captions "
                   "name.txt or name.json")
    p.add_argument("out", help="output folder for shard-NNNNNN.tar")
    p.add_argument("--samples-per-shard", type=int, default=256)
    p.add_argument("--prefix", default="shard")


@command("shards", "write WebDataset shards from a folder of images and captions", _args)
def cmd_shards(args: argparse.Namespace) -> int:
    from zephon_vl.cli.progress import Progress
    from zephon_vl.wds.writer import shards_from_folder

    skipped: list = []
    try:
        with Progress("zephon-vl shards", unit="samples") as progress:
            paths = shards_from_folder(args.folder, args.out, args.samples_per_shard,
                                       args.prefix, skipped=skipped, progress=progress.update)
    finally:
        for path, reason in skipped:
            print(f"{path}: skipped: {reason}", file=sys.stderr)
    for p in paths:
        print(p.resolve())
    return 0
