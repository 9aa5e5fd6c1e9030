"""Decode in the tokenizer against decode after the packer (``decode_after_pack``), side by
side on one benchmark workload: wall time, first batch, CPU per delivered sample and the
cores the run kept busy.

Each run is a fresh process (``fork``) with one `Loader` over the workload for `--epochs`
epochs, the two orders alternating `--reps` times, so a disturbance hits both alike. CPU
is counted, not sampled: the driver process's own (every thread) and its worker processes'
(reaped at `Loader.close`). ``cores`` is CPU over wall: below the machine's cores, they
idled.

The workload's settings come from a benchmark JSON (``zephon-vl bench ... --json PATH``
writes them, with its data built and cached).
Run: ``python scripts/decode_after_pack_ab.py --bench-json PATH --workload fullsize
[--epochs 3] [--reps 2]``
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing as mp
import os
import resource
import statistics
import time
from typing import Any

from zephon_bench.workload import WorkSpec

from zephon_core import Loader


def _spec(bench_json: str, workload: str, epochs: int) -> WorkSpec:
    settings = json.load(open(bench_json))["workloads"][workload]["settings"]
    known = {f.name for f in dataclasses.fields(WorkSpec)}
    fields = {k: v for k, v in settings.items() if k in known}
    fields["shards"] = tuple(os.path.expanduser(p) for p in fields["shards"])
    for k, v in fields.items():
        if isinstance(v, str) and v.startswith("~"):
            fields[k] = os.path.expanduser(v)
    return dataclasses.replace(WorkSpec(**fields), epochs=epochs)


def _cpu(who: int) -> float:
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


def _run(spec: WorkSpec, after: bool, out: Any) -> None:
    recipe = spec.recipe({"decode_after_pack": after})
    own, kids = _cpu(resource.RUSAGE_SELF), _cpu(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    loader = Loader(recipe, 0, 1)
    samples, first = 0, None
    for _ in loader:
        samples += sum(len(row) for row in loader.last_meta.rows)
        first = first if first is not None else time.perf_counter() - start
    wall = time.perf_counter() - start
    loader.close()
    own, kids = _cpu(resource.RUSAGE_SELF) - own, _cpu(resource.RUSAGE_CHILDREN) - kids
    out.put({"wall_s": wall, "first_batch_s": first, "samples": samples,
             "driver_ms": 1000 * own / samples, "workers_ms": 1000 * kids / samples,
             "cores": (own + kids) / wall})


def measure(spec: WorkSpec, after: bool) -> dict:
    """One run in a fresh forked process (its workers are its children)."""
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    p = ctx.Process(target=_run, args=(spec, after, out))
    p.start()
    result = out.get(timeout=1800)
    p.join()
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bench-json", required=True)
    ap.add_argument("--workload", default="fullsize")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--reps", type=int, default=2)
    args = ap.parse_args()
    spec = _spec(args.bench_json, args.workload, args.epochs)
    runs: dict[str, list[dict]] = {"tokenizer": [], "after pack": []}
    for rep in range(args.reps):
        for name, after in (("tokenizer", False), ("after pack", True)):
            r = measure(spec, after)
            runs[name].append(r)
            print(f"rep {rep} {name:10s} wall {r['wall_s']:6.2f} s  first batch "
                  f"{r['first_batch_s']:5.2f} s  CPU/sample driver {r['driver_ms']:5.2f} ms "
                  f"workers {r['workers_ms']:6.2f} ms  cores {r['cores']:.2f}", flush=True)
    for name, rs in runs.items():
        med = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
        print(f"median {name:10s} wall {med['wall_s']:6.2f} s  first batch "
              f"{med['first_batch_s']:5.2f} s  CPU/sample "
              f"{med['driver_ms'] + med['workers_ms']:6.2f} ms  cores {med['cores']:.2f}")


if __name__ == "__main__":
    main()
