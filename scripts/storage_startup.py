"""Start-up cost of a Loader over many small shards: local disk and a local S3 server.

Prints one JSON line per case: shards, where, how the shard list is given
(``cold``: no sidecar yet, every shard indexed; ``sidecars``: cached indexes
read; ``manifest``: one manifest), seconds to build the Loader and to its
first batch. Run: ``python scripts/storage_startup.py``
(needs the ``remote`` and ``dev`` extras for the S3 cases).
"""

from __future__ import annotations

import argparse
import io
import json
import tempfile
import time
from pathlib import Path

from PIL import Image

from zephon_core import Execution, Loader, qwen_tokenizer_dir
from zephon_vl import ImageSettings, build_manifest, vlm_recipe, write_shards
from zephon_vl.testing.storage_servers import s3_server


def tiny_jpeg(i: int) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (56, 56), (i % 256, 80, 160)).save(buf, "JPEG")
    return buf.getvalue()


def make_shards(n: int, out: Path) -> list[Path]:
    samples = [{"__key__": f"{i:07d}", "jpg": tiny_jpeg(i), "txt": f"a small square {i}"}
               for i in range(2 * n)]
    return write_shards(samples, out, samples_per_shard=2)


def measure(spec, label: dict) -> dict:
    ex = Execution(runner="inline")
    t0 = time.perf_counter()
    recipe = vlm_recipe(spec, qwen_tokenizer_dir(), seq_len=512, global_batch_size=8,
                        num_lanes=8, image=ImageSettings(max_pixels=64 * 28 * 28))
    loader = Loader(recipe, 0, 2, ex)
    built = time.perf_counter() - t0
    next(loader)
    first = time.perf_counter() - t0
    loader.close()
    out = {**label, "build_s": round(built, 3), "first_batch_s": round(first, 3)}
    print(json.dumps(out), flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--counts", default="10,1000,10000")
    ap.add_argument("--s3-counts", default="10,1000")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="zephon-startup-"))
    for n in (int(c) for c in args.counts.split(",")):
        shards = make_shards(n, tmp / f"local-{n}")
        measure([str(p) for p in shards], {"shards": n, "where": "local", "given": "cold"})
        measure([str(p) for p in shards], {"shards": n, "where": "local", "given": "sidecars"})
        build_manifest(shards, tmp / f"local-{n}.json")
        measure(str(tmp / f"local-{n}.json"), {"shards": n, "where": "local",
                                                "given": "manifest"})
    with s3_server() as server:
        for n in (int(c) for c in args.s3_counts.split(",")):
            urls = server.upload("zephon-bench", [str(p) for p in
                                                  sorted((tmp / f"local-{n}").glob("*.tar"))])
            measure(urls, {"shards": n, "where": "s3", "given": "cold"})
            t0 = time.perf_counter()
            build_manifest(urls, tmp / f"s3-{n}.json")
            print(json.dumps({"shards": n, "where": "s3", "manifest_build_s":
                              round(time.perf_counter() - t0, 2)}), flush=True)
            measure(str(tmp / f"s3-{n}.json"), {"shards": n, "where": "s3", "given": "manifest"})


if __name__ == "__main__":
    main()
