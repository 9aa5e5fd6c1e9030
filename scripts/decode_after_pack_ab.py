"""Decode in the tokenizer against decode after the packer (``decode_after_pack``), side by
side on one benchmark workload: wall time, first batch, CPU per delivered sample, the
cores the run kept busy and (``--pss``) peak PSS; with ``--row-threads N`` also decode after the
packer with the row decode on N threads of the driver (no row worker processes).

Each run is a fresh process (``fork``) with one `Loader` over the workload for `--epochs`
epochs, the orders alternating `--reps` times, so a disturbance hits both alike. CPU
is counted, not sampled: the driver process's own (every thread) and its worker processes'
(reaped at `Loader.close`). ``cores`` is CPU over wall: below the machine's cores, they
idled. Peak PSS is the process tree's, polled every 0.2 s from this process (as the
benchmark does), so the run's own start method is not changed by the poller; the poll
reads every process's page map and takes CPU from the run, more the more processes it has,
so time and memory are best measured in separate runs. The decode after the packer plans
in one thread of the driver (the recipe's default since 0.4); ``--runners
read=processes,decode=processes,tokenize=processes`` plans in the process pool instead.

The workload's settings come from a benchmark JSON (``zephon-vl bench ... --json PATH``
writes them, with its data built and cached).
Run: ``python scripts/decode_after_pack_ab.py --bench-json PATH --workload fullsize
[--epochs 3] [--reps 2] [--row-threads 2]``
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing as mp
import os
import queue
import resource
import statistics
import time
from typing import Any

from zephon_bench.measure import TreeMonitor
from zephon_bench.workload import WorkSpec

from zephon_core import Execution, Loader
from zephon_core.internals import parse_runners, parse_workers

#: the arrangements compared: decode_after_pack, and where the row decode runs
ORDERS = {"tokenizer": (False, None), "after pack": (True, None),
          "after, threads": (True, "threads")}


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


def _run(spec: WorkSpec, after: bool, execution: Execution, out: Any) -> None:
    recipe = spec.recipe({"decode_after_pack": after})
    own, kids = _cpu(resource.RUSAGE_SELF), _cpu(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    loader = Loader(recipe, 0, 1, execution)
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


def measure(spec: WorkSpec, after: bool, execution: Execution, pss: bool) -> dict:
    """One run in a fresh forked process (its workers are its children); with `pss`, its
    tree polled by the benchmark's own `TreeMonitor`."""
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    p = ctx.Process(target=_run, args=(spec, after, execution, out))
    p.start()
    monitor = TreeMonitor(p.pid) if pss else None
    if monitor is not None:
        monitor.start()
    try:
        result = _result(p, out)
    finally:
        if monitor is not None:
            monitor.stop()
        p.join()
    peak = max(monitor.series.tree_pss) if monitor is not None else 0
    return {**result, "peak_pss_mb": peak / 2**20}


def _result(p: Any, out: Any, limit_s: float = 1800.0) -> dict:
    """The run's result; an error naming the exit code once the run ends without one (a
    failed run would otherwise leave this process waiting on the queue)."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        try:
            return out.get(timeout=1.0)
        except queue.Empty:
            if not p.is_alive() and out.empty():
                raise SystemExit(f"the run ended with exit code {p.exitcode} and no result "
                                 "(its traceback is above)") from None
    raise SystemExit(f"the run gave no result in {limit_s:.0f} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bench-json", required=True)
    ap.add_argument("--workload", default="fullsize")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--row-threads", type=int, default=0,
                    help="also decode after the packer on this many driver threads")
    ap.add_argument("--workers", default="",
                    help="workers of named operators for every order, NAME=N,... (e.g. "
                         "tokenize=1,decode_rows=2)")
    ap.add_argument("--runners", default="",
                    help="runners of named operators for every order, NAME=KIND,... (e.g. "
                         "read=processes,decode=processes,tokenize=processes)")
    ap.add_argument("--pss", action="store_true", help="poll the peak PSS (costs the run CPU)")
    args = ap.parse_args()
    spec = _spec(args.bench_json, args.workload, args.epochs)
    orders = {k: v for k, v in ORDERS.items() if v[1] is None or args.row_threads}
    runs: dict[str, list[dict]] = {name: [] for name in orders}
    for rep in range(args.reps):
        for name, (after, runner) in orders.items():
            workers = dict(parse_workers(args.workers))
            if runner:
                workers["decode_rows"] = args.row_threads
            runners = dict(parse_runners(args.runners))
            if runner:
                runners["decode_rows"] = runner
            ex = Execution(runners=runners, workers=workers)
            r = measure(spec, after, ex, args.pss)
            runs[name].append(r)
            print(f"rep {rep} {name:14s} wall {r['wall_s']:6.2f} s  first batch "
                  f"{r['first_batch_s']:5.2f} s  CPU/sample driver {r['driver_ms']:5.2f} ms "
                  f"workers {r['workers_ms']:6.2f} ms  cores {r['cores']:.2f}"
                  + (f"  peak PSS {r['peak_pss_mb']:5.0f} MB" if args.pss else ""), flush=True)
    for name, rs in runs.items():
        med = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
        print(f"median {name:14s} wall {med['wall_s']:6.2f} s  first batch "
              f"{med['first_batch_s']:5.2f} s  CPU/sample "
              f"{med['driver_ms'] + med['workers_ms']:6.2f} ms  cores {med['cores']:.2f}"
              + (f"  peak PSS {med['peak_pss_mb']:5.0f} MB" if args.pss else ""))


if __name__ == "__main__":
    main()
