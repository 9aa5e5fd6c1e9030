"""Engine measurements for issue 2: restore cost, checkpoint size, fill, text throughput.

    python -m zephon_bench.core_bench [--quick] [--json PATH] [--md PATH]

Restore time is measured on a synthetic recipe (no tokenizer, so the number
is the engine's own cost): after 10 and after 1000 steps, with 1, 4 and 16
lanes per rank (L=16, D=16/4/1). Fill and throughput use the built-in
`text-demo` recipe (real text, real Qwen vocabulary) with the process runner
and 1 or 2 tokenize workers. Medians of repeated measurements.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from zephon_core import (
    Dataset,
    Execution,
    InMemoryReader,
    Loader,
    Map,
    Pack,
    Read,
    Recipe,
    Shuffle,
    merge_states,
    text_demo,
)


def synthetic_tokens(sample: dict) -> dict:
    return {"tokens": (np.arange(sample["n"], dtype=np.int32) + sample["id"]) % 30000}


def synthetic_recipe(num_lanes: int = 16) -> Recipe:
    rng = np.random.default_rng(0)
    shards = [[{"n": int(rng.integers(20, 400)), "id": s * 10000 + i} for i in range(2000)]
              for s in range(8)]
    reader = InMemoryReader(shards)
    ops = [Shuffle(256), Read([reader]), Map(synthetic_tokens), Pack(512, {"max_open_bins": 4})]
    return Recipe([Dataset("synthetic", reader)], ops, global_batch_size=32,
                  num_lanes=num_lanes, seed=0)


def restore_cost(steps: int, lanes_per_rank: int, reps: int) -> dict:
    recipe = synthetic_recipe(16)
    dp = 16 // lanes_per_rank
    loaders = [Loader(recipe, d, dp) for d in range(dp)]
    for _ in range(steps):
        for ld in loaders:
            ld.next_rows()
    state = json.dumps(merge_states([ld.local_state_dict() for ld in loaders]))
    for ld in loaders:
        ld.close()
    times = []
    for _ in range(reps):
        fresh = Loader(recipe, 0, dp)
        t0 = time.perf_counter()
        fresh.load_state_dict(json.loads(state))
        fresh.next_rows()
        times.append(time.perf_counter() - t0)
        fresh.close()
    base = []
    for _ in range(reps):
        fresh = Loader(recipe, 0, dp)
        t0 = time.perf_counter()
        fresh.next_rows()
        base.append(time.perf_counter() - t0)
        fresh.close()
    return {"steps": steps, "lanes_per_rank": lanes_per_rank,
            "restore_and_first_step_s": statistics.median(times),
            "cold_first_step_s": statistics.median(base),
            "checkpoint_bytes": len(state)}


def text_throughput(workers: int, steps: int) -> dict:
    recipe = text_demo()
    ex = Execution(runner="auto", workers={"tokenize": workers})
    with Loader(recipe, 0, 1, ex) as loader:
        t0 = time.perf_counter()
        loader.next_rows()
        first = time.perf_counter() - t0
        tokens = docs = 0
        t0 = time.perf_counter()
        for _ in range(steps):
            rows = loader.next_rows()
            tokens += sum(r.num_tokens for r in rows)
            docs += sum(1 for r in rows for s in r.segments if s.start == 0)
        dt = time.perf_counter() - t0
    capacity = steps * recipe.global_batch_size * recipe.seq_len
    return {"tokenize_workers": workers, "first_batch_s": first,
            "documents_per_s": docs / dt, "tokens_per_s": tokens / dt, "fill": tokens / capacity}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--json", default=None)
    p.add_argument("--md", default=None)
    args = p.parse_args(argv)
    reps = 2 if args.quick else 5
    long = 200 if args.quick else 1000
    results: dict = {"restore": [], "text": []}
    for steps in (10, long):
        for per_rank in (1, 4, 16):
            r = restore_cost(steps, per_rank, reps)
            results["restore"].append(r)
            print(json.dumps(r), file=sys.stderr, flush=True)
    for workers in (1, 2):
        r = text_throughput(workers, 10 if args.quick else 40)
        results["text"].append(r)
        print(json.dumps(r), file=sys.stderr, flush=True)
    lines = ["| steps trained | lanes per rank | restore + first step (s) | cold first step (s) "
             "| checkpoint (bytes) |", "|---|---|---|---|---|"]
    lines += [f"| {r['steps']} | {r['lanes_per_rank']} | {r['restore_and_first_step_s']:.3f} | "
              f"{r['cold_first_step_s']:.3f} | {r['checkpoint_bytes']:,} |"
              for r in results["restore"]]
    lines += ["", "| tokenize workers | first batch (s) | documents/s | tokens/s | fill |",
              "|---|---|---|---|---|"]
    lines += [f"| {r['tokenize_workers']} | {r['first_batch_s']:.1f} | "
              f"{r['documents_per_s']:.0f} | {r['tokens_per_s']:,.0f} | {r['fill']:.1%} |"
              for r in results["text"]]
    table = "\n".join(lines)
    print(table)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    if args.md:
        Path(args.md).write_text(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
