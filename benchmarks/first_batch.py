"""Where zephon's time to the first delivered batch goes (issue 25).

``python -m zephon_bench.first_batch [--workload photos] [--repeat 3] [--set NAME=VALUE]``

Builds the benchmark's recipe for a workload (as ``zephon-vl bench`` does),
then times, from the moment ``Loader(...)`` is called: the constructor (plan,
shard indexes, worker processes started), the first group back from the
workers, and the first delivered (collated) batch; and counts what the lanes
had processed by then (groups, samples, rows made, rows delivered). Each
repetition runs in a fresh process (forked, like the benchmark's runs), so
worker start-up is paid every time. Like a training script, this module
imports torch at its top: a spawned worker that runs the main module again
pays for that. Prints one JSON line per repetition and the medians, with
each worker's start (spawn to ready) and its CPU seconds by then.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any

import torch  # noqa: F401  (a trainer's main module imports torch)


def _cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _pss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith("Pss:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _torch_in_workers(loader: Any) -> bool:
    """Whether a worker mapped torch's library (it imported torch)."""
    for r in loader.runners.values():
        for pid in getattr(r, "pids", []):
            with open(f"/proc/{pid}/maps") as f:
                if "libtorch" in f.read():
                    return True
    return False


def _one(spec_json: dict, flat: dict[str, str], out_fd: int) -> None:
    from zephon_bench.loaders import zephon_execution
    from zephon_bench.workload import WorkSpec

    from zephon_core import Loader, StageEvent
    from zephon_core.internals import StageKind

    spec = WorkSpec.from_json(spec_json)
    recipe = spec.recipe()
    ex = zephon_execution(flat)
    events: list[StageEvent] = []
    t0 = time.monotonic()
    loader = Loader(recipe, 0, 1, ex, observer=events.append)
    t_built = time.monotonic()
    last = max(s.index for s in loader.plan.stages if s.kind is StageKind.TRANSFORM)
    it = iter(loader)
    batch = next(it)
    t_first = time.monotonic()
    n_rows = int(batch["input"].shape[0])
    done = [e for e in events if e.stage == last and e.end <= t_first]
    first_group = min((e.end for e in done), default=None)
    first_submit = min((e.start for e in events if e.stage == last), default=None)
    out = {
        "construct_s": t_built - t0,
        "first_submit_s": None if first_submit is None else first_submit - t0,
        "first_group_s": None if first_group is None else first_group - t0,
        "first_batch_s": t_first - t0,
        "groups_before_first_batch": len(done),
        "samples_before_first_batch": sum(e.elements for e in done),
        "rows_in_first_batch": n_rows,
        "workers": [f"{s.name}:{s.runner_kind}x{s.workers}" for s in loader.plan.stages
                    if s.kind is StageKind.TRANSFORM],
        "group_size": ex.group_size,
        "worker_start_s": [round(t, 3) for r in loader.runners.values()
                           for t in getattr(r, "start_times", [])],
        "worker_cpu_s": [round(_cpu(pid), 3) for r in loader.runners.values()
                         for pid in getattr(r, "pids", [])],
        "worker_pss_mb": [round(_pss_mb(pid)) for r in loader.runners.values()
                          for pid in getattr(r, "pids", [])],
        "worker_imported_torch": _torch_in_workers(loader),
    }
    loader.close()
    os.write(out_fd, json.dumps(out).encode())


def main(argv: list[str] | None = None) -> int:
    from zephon_bench.vlm_bench import preload
    from zephon_bench.workload import WorkSpec

    from zephon_core import qwen_tokenizer_dir

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workload", default="photos", help="photos, fullsize or video")
    p.add_argument("--quick", action="store_true", help="the quick data of the workload")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                   help="a flat Execution setting (docs/settings.md), e.g. --set group_size=2")
    args = p.parse_args(argv)
    if args.workload == "photos":
        from zephon_vl import build_demo_dataset, default_demo_dir

        ds = build_demo_dataset(default_demo_dir() if not args.quick
                                else default_demo_dir().parent / "bench-demo-400",
                                num_samples=2000 if not args.quick else 400)
        spec = WorkSpec(tuple(str(s) for s in ds.shards), str(qwen_tokenizer_dir()))
    else:
        from zephon_bench.workloads import workload_settings

        w = workload_settings(args.workload, args.quick)
        spec = WorkSpec(tuple(w["shards"]), str(qwen_tokenizer_dir()), **w["spec"])
    spec_json = spec.to_json()
    preload(spec_json)
    results = []
    for _ in range(args.repeat):
        r, wfd = os.pipe()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.close(r)
                _one(spec_json, dict(item.split('=', 1) for item in args.set), wfd)
                code = 0
            finally:
                os._exit(code)
        os.close(wfd)
        chunks = []
        while chunk := os.read(r, 65536):
            chunks.append(chunk)
        os.close(r)
        os.waitpid(pid, 0)
        res = json.loads(b"".join(chunks))
        print(json.dumps(res), flush=True)
        results.append(res)
    keys = [k for k, v in results[0].items() if isinstance(v, float | int)]
    med: dict[str, Any] = {k: statistics.median(r[k] for r in results
                                                if r[k] is not None) for k in keys}
    print(json.dumps({"median": med, "load": os.getloadavg()[0]}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
