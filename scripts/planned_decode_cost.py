"""CPU per delivered sample with images planned from their headers against the early decode.

The demo data (real photos and clips) with `--long` of its samples given a caption
too long for any row: the packer drops those. Planned (the built-in recipe), they are
never decoded; decoded first (``DecodeVision.plan = False``, the order before), every
one is. One epoch on one rank. With the inline runner (default) every operator runs in
this process and `time.process_time` counts all of its CPU; with ``--runner processes``
each run is a child process of its own whose CPU, its pool's workers and its start-up
included, `resource.getrusage(RUSAGE_CHILDREN)` counts. CPU time, not wall time: the
machine may be shared. Run: ``python scripts/planned_decode_cost.py [--runner processes]``
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from zephon_core import Execution, Loader
from zephon_vl import WebDatasetReader, build_demo_dataset, vlm_recipe, write_shards
from zephon_vl.families.registry import get_family

LONG = "A caption far too long for any row of this recipe. " * 200


def long_share_shards(out: Path, samples: int, long: float) -> list[str]:
    """The demo's captioned samples (photos and clips), the given share of them, evenly
    spread, with a too-long caption."""
    demo = build_demo_dataset(out_dir=out / "demo", num_samples=samples, seed=0,
                              videos=max(1, samples // 25), samples_per_shard=50)
    reader = WebDatasetReader([str(s) for s in demo.shards])
    rows, n = [], 0
    for s in range(reader.num_shards):
        for i in range(reader.shard_len(s)):
            raw = {k: v for k, v in reader.read(s, i).items() if not k.startswith("__")}
            if "txt" not in raw:
                continue
            if int((n + 1) * long) > int(n * long):
                raw["txt"] = LONG
            rows.append({"__key__": f"s{n:05d}", **raw})
            n += 1
    reader.close()
    return [str(p) for p in write_shards(rows, out / "long", samples_per_shard=50)]


def run(shards: list[str], plan: bool, runner: str = "inline") -> dict[str, float]:
    """One epoch; CPU seconds (this process's), delivered samples and drops."""
    image = get_family("qwen3_5").image_settings(max_pixels=1024 * 1024)
    recipe = vlm_recipe(shards, None, seq_len=2048, global_batch_size=4, num_lanes=4,
                        epochs=1, image=image, shuffle_buffer=16)
    next(o for o in recipe.ops if o.name == "decode").plan = plan
    delivered = drops = 0
    start = time.process_time()
    with Loader(recipe, 0, 1, Execution(runner=runner)) as loader:
        while (rows := loader.next_rows()) is not None:
            delivered += sum(len(r.segments) for r in rows)
            drops += len(loader.last_meta.drops)
    cpu = time.process_time() - start
    return {"cpu_s": cpu, "delivered": delivered, "drops": drops,
            "cpu_ms_per_sample": 1000 * cpu / max(1, delivered)}


def in_child(shards: list[str], plan: bool) -> dict[str, float]:
    """`run` with process workers in a child process; its CPU and its workers'."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run([sys.executable, __file__, "--child", json.dumps([shards, plan])],
                         check=True, capture_output=True, text=True).stdout
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    r = json.loads(out.strip().splitlines()[-1])
    r["cpu_s"] = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    r["cpu_ms_per_sample"] = 1000 * r["cpu_s"] / max(1, r["delivered"])
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=300)
    ap.add_argument("--long", type=float, default=0.3, help="share of too-long samples")
    ap.add_argument("--runner", choices=("inline", "processes"), default="inline")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        shards, plan = json.loads(args.child)
        print(json.dumps(run(shards, plan, "processes")))
        return
    with tempfile.TemporaryDirectory() as tmp:
        shards = long_share_shards(Path(tmp), args.samples, args.long)
        for plan in (False, True, False, True):
            r = run(shards, plan) if args.runner == "inline" else in_child(shards, plan)
            print(f"{'planned' if plan else 'decoded first':>13}: {r['cpu_s']:.2f} s CPU, "
                  f"{r['delivered']} delivered, {r['drops']} dropped, "
                  f"{r['cpu_ms_per_sample']:.1f} ms CPU per delivered sample")


if __name__ == "__main__":
    main()
