"""The ray runner measured: vlm-demo's decode on the local process pool vs on Ray.

Starts a two-node Ray cluster on 127.0.0.1 (`zephon_vl.testing.ray_cluster`: a
head and a worker node offering ``zephon_cpu``, `--cpus` CPUs each), then runs
``vlm-demo`` (one rank) under each execution, interleaved `--repeats` times:

* ``processes``: the default, read+decode+tokenize fused in a local pool of
  `--workers` processes;
* ``decode-ray``: read and tokenize in the local pool, decode as Ray tasks
  (`--workers` at once) on the labelled node;
* ``all-ray``: the fused stage as Ray tasks.

Per run: delivered samples/s (documents that start in a delivered batch, after
`--warmup` steps), and CPU seconds per sample of every process involved (the
driver, its pool, and, for Ray, every process of the cluster: workers, raylets,
GCS). Then the per-sample overhead of each path on a stage that does nothing
(an identity map over `--groups` groups of 8 tiny elements): what a sample
costs to travel, nothing else. Medians. The figures come from whatever machine
runs it: say how busy it was.

    python scripts/ray_bench.py --steps 12 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time

import psutil

from zephon_vl.testing.ray_cluster import LOOPBACK_ENV, LocalRayCluster

LABEL = {"zephon_cpu": 1.0}


def _cpu(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            t = psutil.Process(pid).cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system
    return total


def _tree(cluster: LocalRayCluster | None) -> list[int]:
    me = psutil.Process()
    pids = [me.pid, *(c.pid for c in me.children(recursive=True))]
    return pids + (cluster.pids() if cluster is not None else [])


def executions(workers: int) -> dict:
    from zephon_core import Execution

    return {
        "processes": Execution(default_workers=workers),
        "decode-ray": Execution(default_workers=workers, runners={"decode": "ray"},
                                ray_resources=LABEL),
        "all-ray": Execution(runner="ray", default_workers=workers, ray_resources=LABEL),
    }


def delivered(name: str, ex, cluster: LocalRayCluster, steps: int, warmup: int) -> dict:
    from zephon_core import ElasticRun, load_recipe

    with ElasticRun(lambda: load_recipe("vlm-demo"), ex) as run:
        sim = run.ranks(1)
        list(run.steps(sim, warmup, "warmup"))
        pids = _tree(cluster)
        cpu0, t0 = _cpu(pids), time.perf_counter()
        docs = sum(r.out.documents for r in run.steps(sim, warmup + steps, "run"))
        wall = time.perf_counter() - t0
        cpu = _cpu(pids) - cpu0
    return {"config": name, "samples": docs, "seconds": wall, "samples_per_s": docs / wall,
            "cpu_ms_per_sample": 1e3 * cpu / docs}


def identity(payload: object) -> object:
    return payload


def overhead(kind: str, cluster: LocalRayCluster, workers: int, groups: int) -> dict:
    """Per-sample cost of a runner on a stage that does nothing: wall and CPU."""
    from zephon_core import Element, Map, Origin, RunnerKind
    from zephon_core.extend import StageFn
    from zephon_core.internals import RunnerSpec, make_runner

    fn = StageFn([Map(identity, name="identity")])
    spec = RunnerSpec(RunnerKind(kind), workers, "identity", "spawn",
                      ray_resources=LABEL if kind == "ray" else {})
    runner = make_runner(spec, fn)
    try:
        def batch(g: int) -> list:
            return [Element(g * 8 + i, {"id": g * 8 + i}, Origin(g * 8 + i, 0, 0, i, 0))
                    for i in range(8)]

        for f in [runner.submit(batch(g)) for g in range(2 * workers)]:
            f.result()  # warm: workers started, stage set up
        pids = _tree(cluster)
        cpu0, t0 = _cpu(pids), time.perf_counter()
        inflight = []
        for g in range(groups):
            inflight.append(runner.submit(batch(g)))
            if len(inflight) >= 2 * workers:
                inflight.pop(0).result()
        for f in inflight:
            f.result()
        wall = time.perf_counter() - t0
        cpu = _cpu(pids) - cpu0
    finally:
        runner.close()
    n = groups * 8
    return {"runner": kind, "samples": n, "us_per_sample": 1e6 * wall / n,
            "cpu_us_per_sample": 1e6 * cpu / n}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--cpus", type=int, default=2, help="CPUs of each Ray node")
    p.add_argument("--groups", type=int, default=400)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    os.environ.update(LOOPBACK_ENV)
    root = tempfile.mkdtemp(prefix="zrb", dir="/tmp")
    cluster = LocalRayCluster(root, head_cpus=args.cpus, worker_cpus=args.cpus,
                              worker_resources={"zephon_cpu": args.cpus}, object_store_mb=256)
    with cluster:
        os.environ["RAY_ADDRESS"] = cluster.address
        runs: list[dict] = []
        for _ in range(args.repeats):
            for name, ex in executions(args.workers).items():
                runs.append(delivered(name, ex, cluster, args.steps, args.warmup))
                print(json.dumps(runs[-1]), flush=True)
        over = [overhead(k, cluster, args.workers, args.groups)
                for _ in range(args.repeats) for k in ("processes", "ray")]
    load = os.getloadavg()
    print(f"\nvlm-demo, one rank, {args.steps} steps after {args.warmup}, {args.workers} "
          f"workers, {args.repeats} repeats (medians); {os.cpu_count()} cores, load average "
          f"{load[0]:.1f} {load[1]:.1f}")
    print(f"{'config':<12} {'samples/s':>10} {'CPU ms/sample':>14}")
    for name in executions(args.workers):
        mine = [r for r in runs if r["config"] == name]
        print(f"{name:<12} {statistics.median(r['samples_per_s'] for r in mine):>10.1f} "
              f"{statistics.median(r['cpu_ms_per_sample'] for r in mine):>14.2f}")
    print(f"\nper-sample overhead (identity stage, {args.groups} groups of 8)")
    print(f"{'runner':<12} {'us/sample':>10} {'CPU us/sample':>14}")
    for kind in ("processes", "ray"):
        mine = [r for r in over if r["runner"] == kind]
        print(f"{kind:<12} {statistics.median(r['us_per_sample'] for r in mine):>10.0f} "
              f"{statistics.median(r['cpu_us_per_sample'] for r in mine):>14.0f}")
    shutil.rmtree(root, ignore_errors=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "load": load, "delivered": runs,
                       "overhead": over}, f, indent=1)


if __name__ == "__main__":
    main()
