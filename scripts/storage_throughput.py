"""Read throughput of the vlm-demo shards: local disk vs the local S3 server (moto).

Two numbers per storage: raw sample reads (``WebDatasetReader.read`` over every
sample, one thread) and the vlm-demo pipeline (global batches per second,
inline runner, one rank). Run: ``PYTHONPATH=$PWD python scripts/storage_throughput.py``.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

from tests.helpers.storage import s3_server
from zephon_core.engine.execution import Execution
from zephon_core.engine.loader import Loader
from zephon_core.recipes.assets import qwen_tokenizer_dir
from zephon_vl.demo.data import build_demo_dataset
from zephon_vl.recipes import vlm_recipe
from zephon_vl.wds.index import WebDatasetReader


def raw(shards) -> dict:
    r = WebDatasetReader(shards)
    t0 = time.perf_counter()
    n = nbytes = 0
    for s in range(r.num_shards):
        for i in range(r.shard_len(s)):
            sample = r.read(s, i)
            n += 1
            nbytes += sum(len(v) for k, v in sample.items() if not k.startswith("__"))
    dt = time.perf_counter() - t0
    return {"samples_per_s": round(n / dt, 1), "MB_per_s": round(nbytes / dt / 1e6, 1)}


def pipeline(shards, steps: int = 8) -> dict:
    recipe = vlm_recipe(shards, qwen_tokenizer_dir(), seq_len=2048, global_batch_size=8,
                        num_lanes=8)
    with Loader(recipe, 0, 1, Execution(runner="inline")) as loader:
        next(loader)
        t0 = time.perf_counter()
        for _ in range(steps):
            next(loader)
        dt = time.perf_counter() - t0
    return {"steps_per_s": round(steps / dt, 2)}


def main() -> None:
    ds = build_demo_dataset(out_dir=Path(tempfile.mkdtemp()), num_samples=160, seed=0,
                            videos=2, samples_per_shard=40)
    local = [str(p) for p in ds.shards]
    print(json.dumps({"where": "local", **raw(local), **pipeline(local)}), flush=True)
    with s3_server() as server:
        urls = server.upload("zephon-bench", local)
        print(json.dumps({"where": "s3 (moto, 127.0.0.1)", **raw(urls), **pipeline(urls)}),
              flush=True)


if __name__ == "__main__":
    main()
