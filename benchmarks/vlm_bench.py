"""zephon-vl against Grain, torch DataLoader and the raw limit, on one VLM pipeline, in one run.

Usage (from a checkout)::

    zephon-vl bench --quick --json /tmp/bench.json      # < 3 min on 2 cores
    zephon-vl bench --out bench-out                     # full: 2,000 samples, 3 reps
    python -m zephon_bench.vlm_bench --quick              # the same without the CLI

Every configuration runs in a fresh process (so its memory and CPU are its
own) while this process watches the process tree (psutil) and the machine's
load (/proc/stat). Configurations are interleaved across repetitions, so slow
drifts of the machine hit all loaders alike. Every run must deliver the same
samples and tokens (an order-free checksum of (shard, index, tokens) of every
packed sample); the harness fails loudly otherwise.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from zephon_bench.above_limit import limit_warnings, mark_above_limit
from zephon_bench.portable import portable

from zephon_core.extend import atomic_write, usable_cores

METRICS = ("samples_per_s", "tokens_per_s", "images_per_s", "ttfb_s", "cpu_s_per_sample",
           "cores_used", "main_cpu_s_per_sample", "peak_rss_mb", "peak_shm_mb", "peak_mem_mb",
           "outside_load", "outside_load_steady", "wall_s", "overall_samples_per_s",
           "steady_samples", "steady_seconds", "stage_samples_per_s")


# --- arguments --------------------------------------------------------------------

def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true",
                   help="fewer samples, a smaller grid, one repetition (< 3 min on 2 cores)")
    p.add_argument("--json", default=None, metavar="PATH", help="also write the JSON here")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="folder for bench.json, bench.md, bench.png and logs "
                        "(default: ./bench-out)")
    p.add_argument("--samples", type=int, default=None,
                   help="image samples in the demo data (default 2000; quick 400)")
    p.add_argument("--data", default=None, metavar="DIR",
                   help="demo data folder (made if missing; default: the zephon cache)")
    p.add_argument("--reps", type=int, default=None,
                   help="runs of the default and of each loader's best configuration; the "
                        "rest of the grid runs once (default 3; quick 1)")
    p.add_argument("--epochs", type=int, default=None, help="passes over the data (default 1)")
    p.add_argument("--warmup", type=float, default=None,
                   help="fraction of the samples before the steady state (default 0.2)")
    p.add_argument("--draft", action="store_true", help="JPEG draft decoding for all loaders")
    p.add_argument("--workload", default="photos", metavar="WORKLOADS",
                   help="comma-separated: photos (the demo data, default), fullsize (1-12 "
                        "megapixel photos), video (clips of 10 s to 5 min), each also as "
                        "NAME+busy (a neighbour process keeps one core busy; rates also as "
                        "a share of the quiet ones); all = the three, then the three +busy; "
                        "text, text-mix: the text pipeline, one dataset and a 0.7/0.3 mixture "
                        "(zephon_bench.text_bench; in a command of their own). "
                        "Data is built once and cached (docs/benchmarks.md, Workloads)")
    p.add_argument("--only", default=None, metavar="FAMILIES",
                   help="comma-separated subset of zephon,grain,torch,spdl,energon,limit")
    p.add_argument("--modes", default="e2e,worker", metavar="MODES",
                   help="what to measure, comma-separated: e2e (collated training batches "
                        "delivered to the main process) and/or worker (processed documents "
                        "reaching the main process; no collate). Default: both")
    p.add_argument("--e2e-epochs", type=int, default=None,
                   help="passes over the data in the delivered-batch runs (default 2): "
                        "a loader that holds finished documents delivers them in a burst at "
                        "the end of the data, so the steady window must end well before")
    p.add_argument("--normalize", choices=["device", "collate"], default="device",
                   help="the collate's pixels: device = uint8 rows + table, normalized by "
                        "to_device on the accelerator (default); collate = float32 rows made "
                        "on the CPU")
    p.add_argument("--grid", choices=["loaders", "workers"], default="loaders",
                   help="loaders: zephon and the other loaders (default); workers: zephon's "
                   "delivered batches with --workers auto beside fixed worker splits, every "
                   "configuration repeated --reps times, interleaved")
    p.add_argument("--no-scaling", action="store_true", help="skip the 1/2/4-process scaling")
    p.add_argument("--no-breakdown", action="store_true", help="skip the per-stage breakdown")
    p.add_argument("--max-outside-load", type=float, default=0.15,
                   help="a run is 'disturbed' when other processes kept more than this "
                        "fraction of the machine busy (default 0.15)")
    p.add_argument("--retries", type=int, default=None,
                   help="re-runs of disturbed runs, in all (default 3; quick 0)")
    p.add_argument("--wait-quiet", type=float, default=None, metavar="SECONDS",
                   help="before each run, wait up to this long for the machine to be quiet "
                        "(other load under --max-outside-load); at most 10x this in all "
                        "(default 15; quick 0)")
    p.add_argument("--render", default=None, metavar="BENCH_JSON",
                   help="run nothing: summarize a saved bench.json again and write its table "
                        "and chart to --out")
    p.add_argument("--timeout", type=float, default=None,
                   help="seconds before one run is killed (default 600; quick 150)")
    from zephon_bench.text_bench import add_text_arguments

    add_text_arguments(p)


# --- configurations -----------------------------------------------------------------

FAMILIES = ("zephon", "grain", "torch", "spdl", "energon", "limit")


def _cfg(name: str, family: str, params: dict, scaling: int | None = None,
         scaling_only: bool = False, mode: str = "worker") -> dict:
    return {"name": name, "family": family, "params": params, "scaling": scaling,
            "scaling_only": scaling_only, "mode": mode}


def have_spdl() -> bool:
    import importlib.util

    return importlib.util.find_spec("spdl") is not None


def have_energon() -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec("megatron.energon") is not None
    except ModuleNotFoundError:
        return False


def workers_configurations(ncpu: int) -> list[dict]:
    """``--grid workers``: delivered batches with ``--workers auto`` beside fixed splits
    (docs/benchmarks.md, "Workers that size themselves")."""

    def c(name: str, **execution: Any) -> dict:
        return _cfg(f"zephon {name}", "zephon", {"execution": execution}, mode="e2e")

    cfgs = [c("default")]
    cfgs += [c(f"fixed: read+decode+tokenize fused, {n} processes", default_workers=n)
             for n in range(1, ncpu + 2) if n != usable_cores()]
    cfgs.append(c(f"fixed: read+decode {ncpu}, tokenize 1 (two stages)",
                  workers={"read": ncpu, "decode": ncpu, "tokenize": 1}))
    cfgs.append(c("workers auto", workers="auto"))
    # three process stages: a budget above three leaves the sizer something to move
    budget = max(ncpu, 3) + 1
    cfgs.append(c(f"workers auto, one stage per operator, budget {budget}", workers="auto",
                  default_workers=budget, fuse=False))
    return cfgs


def e2e_configurations(quick: bool, ncpu: int, spdl: bool | None = None,
                       energon: bool | None = None) -> list[dict]:
    """The delivered-batch grid: zephon through `Loader` (default + a few knobs), Grain,
    DataLoader, SPDL and Megatron-Energon packing and collating as their users would, the
    raw limit."""
    spdl = have_spdl() if spdl is None else spdl
    energon = have_energon() if energon is None else energon

    def c(name: str, family: str, params: dict) -> dict:
        return _cfg(name, family, params, mode="e2e")

    cfgs = [c("zephon default", "zephon", {"execution": {}})]
    if not quick:
        cfgs += [c("zephon driver thread (background=True)", "zephon",
                   {"execution": {}, "background": True}),
                 c("zephon spawned workers (start_method=spawn)", "zephon",
                   {"execution": {"start_method": "spawn"}}),
                 c("zephon prefetch 4 groups per lane", "zephon", {"execution": {"prefetch": 4}}),
                 # the default before 0.4: every sample decoded by the tokenizer stage
                 c("zephon decode before packing (decode_after_pack=false)", "zephon",
                   {"execution": {}, "pack": {"decode_after_pack": False}}),
                 # the planning operators (read, headers, tokens) in the process pool
                 # instead of one thread of the loader's process
                 c("zephon planning in processes", "zephon",
                   {"execution": {"runners": {"read": "processes", "decode": "processes",
                                              "tokenize": "processes"}}})]
    ggrid = [(ncpu, 1)] if quick else [(ncpu, 1), (ncpu, 2), (ncpu + 1, 1)]
    cfgs += [c(f"grain mp_prefetch={w} threads={th}", "grain",
               {"workers": w, "threads": th, "buffer": 16}) for w, th in ggrid]
    cfgs += [c(f"torch num_workers={w}", "torch", {"workers": w})
             for w in ([ncpu] if quick else [ncpu, ncpu + 1])]
    if spdl:
        cfgs += [c(f"spdl {w} processes", "spdl", {"workers": w, "threads": 2})
                 for w in ([ncpu] if quick else [ncpu, ncpu + 1])]
    if energon:
        cfgs += [c(f"energon num_workers={w}", "energon", {"workers": w})
                 for w in ([ncpu] if quick else [ncpu, ncpu + 1])]
    cfgs += limit_configurations(ncpu, c)
    return cfgs


def limit_configurations(ncpu: int, c: Any) -> list[dict]:
    """The raw limit's arrangements (:mod:`zephon_bench.raw_limit`); the best is the limit."""
    return [c(f"raw limit {ncpu} processes", "limit", {"processes": ncpu}),
            c(f"raw limit {ncpu} spawned processes", "limit",
              {"processes": ncpu, "start_method": "spawn"}),
            c(f"raw limit {ncpu} threads", "limit", {"threads": ncpu})]


def _zephon(name: str, scaling: int | None = None, **execution: Any) -> dict:
    """A zephon configuration: `execution` is flat `Execution` settings."""
    return _cfg(f"zephon {name}", "zephon", {"execution": execution}, scaling=scaling)


def _zephon_fused(n: int) -> dict:
    return _zephon(f"read+decode+tokenize fused, {n} processes", default_workers=n, scaling=n)


def configurations(quick: bool, ncpu: int, scaling: bool) -> list[dict]:
    """The grid: zephon default + per-operator workers, Grain, DataLoader, the raw limit.

    zephon's default runs read, decode and tokenize fused in one process per
    core (``usable_cores()``), so it is also the scaling point for that count.
    """
    per_core = usable_cores()
    cfgs = [_cfg("zephon default", "zephon", {"execution": {}}, scaling=per_core)]
    cfgs.append(_zephon(f"read on threads, decode+tokenize fused, {ncpu} processes",
                        runners="read=threads", default_workers=ncpu))
    if quick:
        ggrid = [(1, 2), (2, 1)]
        tgrid = [2]
    else:
        cfgs.append(_zephon(f"decode={ncpu} tokenize=1 (two process stages)",
                            workers=f"read={ncpu},decode={ncpu},tokenize=1"))
        cfgs += [_zephon("group size 4", group_size=4),
                 _zephon("prefetch 4 groups per lane", prefetch=4)]
        if per_core != ncpu:
            cfgs.append(_zephon_fused(ncpu))
        ggrid = [(1, 2), (1, 4), (2, 1), (2, 2)]
        tgrid = [1, 2, 3]
    for w, th in ggrid:
        cfgs.append(_cfg(f"grain mp_prefetch={w} threads={th}", "grain",
                         {"workers": w, "threads": th, "buffer": 16},
                         scaling=w if th == 1 else None))
    for w in tgrid:
        cfgs.append(_cfg(f"torch num_workers={w}", "torch", {"workers": w, "batch_size": 8}))
    cfgs.append(_cfg(f"raw limit {ncpu} processes", "limit", {"processes": ncpu}, scaling=ncpu))
    if scaling:
        have = {(c["family"], c["scaling"]) for c in cfgs}
        for n in (1, 2, 4):
            if ("limit", n) not in have:
                cfgs.append(_cfg(f"raw limit {n} processes", "limit", {"processes": n},
                                 scaling=n, scaling_only=True))
            if not quick and ("zephon", n) not in have:
                c = _zephon_fused(n)
                c["scaling_only"] = True
                cfgs.append(c)
            if not quick and ("grain", n) not in have:
                cfgs.append(_cfg(f"grain mp_prefetch={n} threads=1", "grain",
                                 {"workers": n, "threads": 1, "buffer": 16}, scaling=n,
                                 scaling_only=True))
    return sorted(cfgs, key=lambda c: FAMILIES.index(c["family"]))  # stable: grid order kept


# --- one run in a child process ---------------------------------------------------------

def preload(spec_json: dict) -> None:
    """Import what every run needs and build the recipe once, before the runs are forked.

    Runs are forked from this process, so they start in milliseconds with warm
    caches (modules, tokenizer, shard indexes) instead of paying seconds of
    imports each; the clock of a run starts when its loader is constructed.
    Nothing here starts a thread or uses the tokenizer, so forking stays safe.
    """
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import grain  # noqa: F401
    import psutil  # noqa: F401
    import torch  # noqa: F401
    import torch.utils.data  # noqa: F401
    from zephon_bench.e2e import RUNNERS  # noqa: F401
    from zephon_bench.grain_pack import PackRows  # noqa: F401

    if have_spdl():
        import spdl.pipeline  # noqa: F401
    if have_energon():
        import megatron.energon  # noqa: F401
    from zephon_bench.workload import WorkSpec

    from zephon_core import Loader  # noqa: F401

    WorkSpec.from_json(spec_json).recipe()


#: the delivered-batch runs' steady window ends at this fraction of the samples: the
#: end-of-data burst of a loader's backlog (zephon's lanes hold a few hundred finished
#: documents) stays outside it
E2E_END_FRAC = 0.75


def run_one(cfg: dict, spec_json: dict, logdir: Path, timeout: float, tag: str,
            warm_frac: float = 0.2, end_frac: float = 0.9, busy: bool = False) -> dict:
    """Fork a child that runs one configuration; watch its process tree until it ends.
    `busy`: a neighbour process keeps one core busy from before the run starts to its end."""
    from zephon_bench.neighbour import Neighbour

    neighbour = Neighbour().start() if busy else None
    try:
        return _run_one(cfg, spec_json, logdir, timeout, tag, warm_frac, end_frac, neighbour)
    finally:
        if neighbour is not None:
            neighbour.stop()


def _run_one(cfg: dict, spec_json: dict, logdir: Path, timeout: float, tag: str,
             warm_frac: float, end_frac: float, neighbour: Any) -> dict:
    from zephon_bench.measure import TreeMonitor, fork_logged, metrics

    result_path = logdir / f"{tag}.result.json"
    log_path = logdir / f"{tag}.log"
    job = {"family": cfg["family"], "params": cfg["params"], "spec": spec_json,
           "mode": cfg.get("mode", "worker")}
    pid = fork_logged(log_path, lambda: child_main(json.dumps(job), str(result_path)))
    mon = TreeMonitor(pid, neighbours=(neighbour.pid,) if neighbour is not None else ())
    mon.start()
    deadline = time.monotonic() + timeout
    status = None
    try:
        while True:
            done, st = os.waitpid(pid, os.WNOHANG)
            if done:
                status = os.waitstatus_to_exitcode(st)
                break
            if time.monotonic() > deadline:
                _kill_tree(pid)
                os.waitpid(pid, 0)
                status = "timeout"
                break
            time.sleep(0.05)
    finally:
        mon.stop()
        _kill_tree(pid, only_children=True, grace=10.0 if status == 0 else 0.0)
    if status != 0 or not result_path.is_file():
        tail = log_path.read_text(errors="replace")[-3000:] if log_path.exists() else ""
        return {"ok": False, "error": f"exit {status}", "log_tail": tail}
    result = json.loads(result_path.read_text())
    m = metrics(result, mon.series, warm_frac, end_frac)
    return {"ok": True, "metrics": m, "tally": result["tally"], "extra": result["extra"]}


def _session(pid: int, only_children: bool) -> list:
    import psutil

    procs = []
    for p in psutil.process_iter(["pid"]):
        try:
            if p.pid != os.getpid() and os.getsid(p.pid) == pid and p.status() != "zombie":
                procs.append(p)
        except (psutil.Error, OSError):
            pass
    return [p for p in procs if p.pid != pid] if only_children else procs


def _kill_tree(pid: int, only_children: bool = False, grace: float = 0.0) -> None:
    """Kill a run's process and what it left behind (processes of its session).

    After a clean exit, leftovers get `grace` seconds to end by themselves: a
    multiprocessing resource tracker unlinks the shared memory its clients
    leaked only when it ends on its own.
    """
    import psutil

    procs = _session(pid, only_children)
    if procs and grace > 0:
        psutil.wait_procs(procs, timeout=grace)
        procs = _session(pid, only_children)
    for p in procs:
        try:
            p.kill()
        except psutil.Error:
            pass


def child_main(job_json: str, result_path: str) -> int:
    from zephon_bench import e2e, loaders
    from zephon_bench.workload import WorkSpec

    job = json.loads(job_json)
    spec = WorkSpec.from_json(job["spec"])
    runners = e2e.RUNNERS if job.get("mode") == "e2e" else loaders.RUNNERS
    trace = runners[job["family"]](spec, job["params"])
    atomic_write(result_path, json.dumps(trace.report()))
    del trace
    _release_grain_shm()
    return 0


def _release_grain_shm() -> None:
    """Let Grain unlink the shared memory of the arrays it delivered before the run exits.

    Grain unlinks a delivered array's segment when the array is freed, on a
    thread pool; a process leaving with ``os._exit`` would drop that queue and
    leak the segments in /dev/shm.
    """
    import gc

    gc.collect()
    mod = sys.modules.get("grain._src.python.ipc.shared_memory_array")
    pool = getattr(getattr(mod, "SharedMemoryArray", None), "_del_thread_pool", None)
    if pool is not None:
        pool.close()
        pool.join()


# --- the whole benchmark ----------------------------------------------------------------

def _key(cfg: dict) -> str:
    """``e2e: zephon default`` (the photos workload), ``video+busy e2e: ...`` (others)."""
    workload = cfg.get("workload", "photos")
    prefix = "" if workload == "photos" else f"{workload} "
    return f"{prefix}{cfg.get('mode', 'worker')}: {cfg['name']}"


def check_tallies(runs: dict[str, list[dict]]) -> list[str]:
    """Every run of a mode delivered the same samples (checksum of shard, index, tokens),
    tokens, images and drops; delivered-batch runs also the same patch rows (their own
    number of epochs, so they are compared among themselves). Returns the misfits."""
    common = ("samples", "tokens", "images", "dropped", "checksum")
    out: list[str] = []
    ref: dict[str, tuple[str, tuple]] = {}
    for key, rs in runs.items():
        # a workload with the busy neighbour delivers what the same workload does without
        scope = key.split(":", 1)[0].replace("+busy", "")
        fields = (*common, "patches", "pixel_sum") if scope.endswith("e2e") else common
        for r in rs:
            got = tuple(r["tally"].get(f) for f in fields)
            if scope not in ref:
                ref[scope] = (key, got)
            elif got != ref[scope][1]:
                out.append(f"{key} rep {r['rep']}: {'/'.join(fields)} {got} != "
                           f"{ref[scope][0]}'s {ref[scope][1]}")
    return out


def machine_info() -> dict:
    model = "?"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                model = line.split(":", 1)[1].strip()
    except (OSError, subprocess.SubprocessError):
        pass
    import importlib.metadata as md

    def version(dist: str) -> str | None:
        try:
            return md.version(dist)
        except md.PackageNotFoundError:
            return None

    from zephon_vl import pillow_backend

    return {
        "nproc": usable_cores(),
        "cpu_count": os.cpu_count(), "cpu_model": model, "python": platform.python_version(),
        "platform": platform.platform(), "pillow_backend": pillow_backend(),
        "pillow": version("pillow-simd") or version("Pillow"), "grain": version("grain"),
        "torch": version("torch"), "transformers": version("transformers"),
        "spdl": version("spdl"), "megatron_energon": version("megatron-energon"),
    }


def _usable(runs: list[dict]) -> list[dict]:
    """The undisturbed runs, or all of them when every run was disturbed."""
    return [r for r in runs if not r["disturbed"]] or runs


def _median(runs: list[dict], key: str) -> float | None:
    """Median of a metric over runs as `run_one` returns them."""
    return _median_of([r["metrics"] for r in runs], key)


def _median_of(metrics: list[dict], key: str) -> float | None:
    vals = [m[key] for m in metrics if m.get(key) is not None]
    return statistics.median(vals) if vals else None


def _medians_and_best(configs: list[dict]) -> dict[str, str]:
    """Fill each configuration's medians and run counts; return each family's best.

    A family's best is the fastest by median among its most-repeated configurations (the
    first pass's winner, run `reps` times), so one lucky single run never outranks a median.
    """
    for c in configs:
        rs = c["runs"]
        good = [r for r in rs if not r["disturbed"]]
        use = good or rs
        c["runs_ok"], c["runs_disturbed"] = len(good), len(rs) - len(good)
        c["median"] = {k: _median_of(use, k) for k in METRICS} if use else {}
    best: dict[str, str] = {}
    for fam in FAMILIES:
        cands = [c for c in configs if c["family"] == fam and c["median"].get("samples_per_s")]
        most = max((len(c["runs"]) for c in cands), default=0)
        cands = [c for c in cands if len(c["runs"]) == most]
        if cands:
            best[fam] = max(cands, key=lambda c: c["median"]["samples_per_s"])["name"]
    return best


def _ratio(x: float | None, y: float | None) -> float | None:
    return x / y if x and y else None


def _summarize_e2e(report: dict) -> None:
    """The delivered-batch ratios of zephon's default against each loader's best."""
    configs = report.get("e2e_configs") or []
    if not configs:
        report.pop("e2e", None)
        return
    configs.sort(key=lambda c: FAMILIES.index(c["family"]))
    best = _medians_and_best(configs)
    by_name = {c["name"]: c["median"] for c in configs}

    def med(name: str | None, key: str = "samples_per_s") -> float | None:
        return by_name.get(name, {}).get(key) if name else None

    z = "zephon default"
    worker = {c["name"]: c.get("median", {}) for c in report.get("configs", [])}
    stage = worker.get(z, {}).get("samples_per_s")
    e2e = {
        "best": best,
        # the loaders' configurations whose rate passed the raw limit's (above_limit.py)
        "above_limit": mark_above_limit(configs, best.get("limit")),
        "samples_per_s": {f: med(n) for f, n in best.items()},
        "zephon_default_samples_per_s": med(z),
        "ratio_vs_grain": _ratio(med(z), med(best.get("grain"))),
        "ratio_vs_limit": _ratio(med(z), med(best.get("limit"))),
        "ratio_vs_torch": _ratio(med(z), med(best.get("torch"))),
        "peak_pss_vs_grain": _ratio(med(z, "peak_mem_mb"), med(best.get("grain"), "peak_mem_mb")),
        "cpu_per_sample_vs_grain": _ratio(med(z, "cpu_s_per_sample"),
                                          med(best.get("grain"), "cpu_s_per_sample")),
        "cpu_per_sample_vs_limit": _ratio(med(z, "cpu_s_per_sample"),
                                          med(best.get("limit"), "cpu_s_per_sample")),
        "zephon_best_vs_grain": _ratio(med(best.get("zephon")), med(best.get("grain"))),
        # zephon/Grain if zephon spent only the raw limit's CPU per sample (the operators
        # alone) on the cores it used: every loader runs the same operators, so no loader
        # can pass this
        "ceiling_vs_grain": _ratio(_ratio(med(z, "cores_used"),
                                          med(best.get("limit"), "cpu_s_per_sample")),
                                   med(best.get("grain"))),
        "e2e_over_worker_stage": _ratio(med(z), stage),
        # the same run's last process stage over the same window: what the driver kept up with
        "zephon_default_stage_in_run_samples_per_s": med(z, "stage_samples_per_s"),
        "targets": {"ratio_vs_grain": 1.25, "ratio_vs_limit": 0.85,
                    "e2e_over_worker_stage": 0.9, "peak_pss_vs_grain": 1.0},
    }
    if best.get("spdl"):
        e2e["ratio_vs_spdl"] = _ratio(med(z), med(best.get("spdl")))
    if best.get("energon"):
        e2e["ratio_vs_energon"] = _ratio(med(z), med(best.get("energon")))
    report["e2e"] = e2e
    report["e2e_over_worker_stage"] = e2e["e2e_over_worker_stage"]


def _summarize_workloads(report: dict) -> None:
    """Each workload's delivered-batch block (as ``report["e2e"]``), and for each
    ``NAME+busy`` run beside ``NAME``: every loader's rate as a share of its quiet rate
    (its quiet best configuration, run in both)."""
    workloads = report.get("workloads") or {}
    for name, w in workloads.items():
        sub = {"e2e_configs": w["e2e_configs"],
               "configs": report.get("configs", []) if name == "photos" else []}
        _summarize_e2e(sub)
        w["e2e"] = sub.get("e2e")
    for name, w in workloads.items():
        quiet = workloads.get(name.removesuffix("+busy"))
        if not name.endswith("+busy") or not quiet or not quiet.get("e2e") or not w.get("e2e"):
            continue
        med = {c["name"]: c["median"] for c in w["e2e_configs"]}
        share = {fam: _ratio(med.get(cfg, {}).get("samples_per_s"),
                             quiet["e2e"]["samples_per_s"].get(fam))
                 for fam, cfg in quiet["e2e"]["best"].items()}
        zq = quiet["e2e"]["zephon_default_samples_per_s"]
        z = med.get("zephon default", {})
        share["zephon"] = _ratio(z.get("samples_per_s"), zq)
        w["e2e"]["share_of_quiet"] = share
        w["e2e"]["zephon_share_over_grain_share"] = _ratio(share.get("zephon"),
                                                           share.get("grain"))
        # the CPU per sample zephon would have needed, on the cores it got beside the
        # neighbour, to keep Grain's share; beside the raw limit's under the same load
        w["e2e"]["cpu_per_sample_for_grain_share"] = _ratio(
            z.get("cores_used"), zq * share["grain"] if zq and share.get("grain") else None)
        w["e2e"]["limit_cpu_per_sample"] = med.get(
            quiet["e2e"]["best"].get("limit"), {}).get("cpu_s_per_sample")


def summarize(report: dict) -> dict:
    """Medians, each loader's best, the ratios, the scaling table and the warnings, from
    the runs in `report["configs"]` (worker stage) and `report["e2e_configs"]` (delivered
    batches), so a saved bench.json can be summarized again."""
    configs = report["configs"] = sorted(report.get("configs", []),
                                         key=lambda c: FAMILIES.index(c["family"]))
    best = _medians_and_best(configs)
    by_name = {c["name"]: c for c in configs}

    def rate(name: str | None) -> float | None:
        return by_name[name]["median"].get("samples_per_s") if name in by_name else None

    def cpu(name: str | None) -> float | None:
        return by_name[name]["median"].get("cpu_s_per_sample") if name in by_name else None

    report["best"] = best
    report["above_limit"] = mark_above_limit(configs, best.get("limit"))
    report["best_samples_per_s"] = {f: rate(n) for f, n in best.items()}
    report["ratio_vs_grain"] = _ratio(rate(best.get("zephon")), rate(best.get("grain")))
    report["ratio_vs_limit"] = _ratio(rate(best.get("zephon")), rate(best.get("limit")))
    report["ratio_vs_torch"] = _ratio(rate(best.get("zephon")), rate(best.get("torch")))
    report["zephon_default_vs_grain"] = _ratio(rate("zephon default"), rate(best.get("grain")))
    # CPU per sample does not depend on how much of the machine other jobs took
    report["cpu_per_sample_vs_grain"] = _ratio(cpu(best.get("zephon")), cpu(best.get("grain")))
    report["cpu_per_sample_vs_limit"] = _ratio(cpu(best.get("zephon")), cpu(best.get("limit")))
    if report.get("scaling") != {}:
        procs = [1, 2, 4]
        table: dict[str, list[float | None]] = {}
        for fam in ("zephon", "grain", "limit"):
            row = []
            for n in procs:
                cs = [c for c in configs if c["family"] == fam and c["scaling"] == n]
                row.append(cs[0]["median"].get("samples_per_s") if cs else None)
            if any(v is not None for v in row):
                table[fam] = row
        report["scaling"] = {
            "processes": procs, "samples_per_s": table,
            "note": "zephon: read, decode and tokenize fused in N processes (N = cores: the "
                    "default); "
                    "Grain: mp_prefetch N workers, 1 read thread; limit: N processes"} \
            if table else {}
    _summarize_e2e(report)
    _summarize_workloads(report)
    every = configs + (report.get("e2e_configs") or []) + [
        c for name, w in (report.get("workloads") or {}).items()
        if name != report["settings"].get("workload", "photos") for c in w["e2e_configs"]]
    disturbed = sum(c["runs_disturbed"] for c in every)
    limit = report["settings"].get("max_outside_load", 0.15)
    report["warnings"] = [
        f"{disturbed} run(s) were disturbed by other load on the machine (> {100 * limit:.0f}% "
        "of it busy outside the benchmark); medians use undisturbed runs where a "
        "configuration has any"] if disturbed else []
    report["warnings"] += limit_warnings(report)
    return report


def render(path: str, out: Path) -> dict:
    """Summarize a saved bench.json again and write its table and chart."""
    from zephon_bench.report import markdown

    report = summarize(json.loads(Path(path).read_text()))
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(json.dumps(report, indent=1))
    (out / "bench.md").write_text(markdown(report))
    charts(report, out)
    return report


def charts(report: dict, out: Path) -> list[Path]:
    """bench-e2e.png (delivered batches), bench-workloads.png (two or more workloads) and
    bench.png (worker stage), those with runs."""
    from zephon_bench.report import chart, e2e_chart, workloads_chart

    done = []
    if report.get("e2e"):
        e2e_chart(report, out / "bench-e2e.png")
        done.append(out / "bench-e2e.png")
    if len(report.get("workloads") or {}) > 1:
        workloads_chart(report, out / "bench-workloads.png")
        done.append(out / "bench-workloads.png")
    if any(c.get("median") for c in report.get("configs", [])):
        chart(report, out / "bench.png")
        done.append(out / "bench.png")
    return done


def _data(args: argparse.Namespace, samples: int) -> Any:
    from zephon_vl import build_demo_dataset, default_demo_dir

    if args.data:
        out = Path(args.data)
    elif samples == 2000:
        out = default_demo_dir()  # the vlm-demo data set itself
    else:
        out = default_demo_dir().parent / f"bench-demo-{samples}"
    return build_demo_dataset(out, num_samples=samples)


def _say(msg: str) -> None:
    """A warning, a failure or the final result: stderr, always (piped too)."""
    print(msg, file=sys.stderr, flush=True)


def _warn(progress: Any, msg: str) -> None:
    """`_say` that keeps a terminal's progress line whole (printed above it)."""
    if progress.enabled:
        progress.say(msg)
    else:
        _say(msg)


def report_run(progress: Any, key: str, m: dict, disturbed: bool, elapsed_s: float) -> None:
    """One finished run: its line above a terminal's progress line, else on stderr (a run
    of hours in nohup shows how far it got; stdout keeps only the results)."""
    _warn(progress, f"  [{elapsed_s:6.1f}s] {key[:66]:<66} "
                 f"{m['samples_per_s']:7.1f} samples/s  ttfb {m['ttfb_s'] or 0:5.2f}s  "
                 f"cpu {1000 * (m['cpu_s_per_sample'] or 0):5.1f} ms/sample  "
                 f"outside {100 * m['outside_load']:3.0f}%" + ("  DISTURBED" if disturbed else ""))
    progress.advance(note=key[:40])


def _print_results(md: str, report: dict) -> None:
    """The tables on stdout; a raw limit that a loader passed on stderr too (a nohup log)."""
    print(md)
    for line in limit_warnings(report):
        _say(f"warning: {line}")


def run(args: argparse.Namespace) -> int:
    """The benchmark; the runs' lines show on a terminal only (`report_run`)."""
    from zephon_bench.report import markdown
    from zephon_bench.text_bench import run as run_text
    from zephon_bench.text_bench import text_workloads

    from zephon_vl.cli.progress import Progress

    if text_workloads(args.workload):
        return run_text(args)
    if args.render:
        report = render(args.render, Path(args.out or "bench-out"))
        print(markdown(report))
        return 0
    with Progress("zephon-vl bench", None, "runs") as progress:
        return _run(args, progress)


def _run(args: argparse.Namespace, progress: Any) -> int:
    from zephon_bench.report import markdown
    from zephon_bench.workload import WorkSpec

    from zephon_core import qwen_tokenizer_dir

    t_begin = time.monotonic()
    quick = args.quick
    samples = args.samples or (400 if quick else 2000)
    epochs = args.epochs or 1
    warm = args.warmup if args.warmup is not None else 0.2
    reps = args.reps or (1 if quick else 3)
    retries = args.retries if args.retries is not None else (0 if quick else 3)
    timeout = args.timeout or (150.0 if quick else 600.0)
    out = Path(args.out or "bench-out")
    out.mkdir(parents=True, exist_ok=True)
    logdir = Path(tempfile.mkdtemp(prefix="runs-", dir=out))
    machine = machine_info()
    ncpu = machine["nproc"]
    from zephon_bench.workloads import parse_workloads, workload_settings

    from zephon_vl import WebDatasetReader

    workloads = parse_workloads(args.workload)
    modes = [m for m in args.modes.split(",") if m]
    if not set(modes) <= {"e2e", "worker"}:
        raise SystemExit(f"--modes takes e2e and/or worker, got {args.modes!r}")
    data: dict[str, dict] = {}  # base workload -> its data, spec and settings
    for base in dict.fromkeys(w.base for w in workloads):
        if base == "photos":
            ds = _data(args, samples)
            spec = WorkSpec(tuple(str(s) for s in ds.shards), str(qwen_tokenizer_dir()),
                            draft=args.draft, epochs=epochs, normalize=args.normalize)
            info = {"samples": ds.num_samples, "images": ds.num_images, "data": str(ds.root)}
        else:
            progress.say(f"zephon-vl bench: the {base} workload's data (built once, then "
                         "cached)")
            w = workload_settings(base, quick)
            spec = WorkSpec(tuple(w["shards"]), str(qwen_tokenizer_dir()), draft=args.draft,
                            epochs=epochs, normalize=args.normalize, **w["spec"])
            info = {"samples": w["samples"], "data": str(w["root"]),
                    "images": w["samples"] if base == "fullsize" else 0,
                    "videos": w["samples"] if base == "video" else 0}
        # index the shards once here, so no run pays for it
        reader = WebDatasetReader(list(spec.shards))
        for s in range(reader.num_shards):
            reader.index(s)
        spec_json = spec.to_json()
        data[base] = {"spec": spec, "spec_json": spec_json, "info": info,
                      "e2e_spec": {**spec_json, "epochs": args.e2e_epochs or 2}}
        preload(spec_json)
    first = data[workloads[0].base]
    spec, spec_json = first["spec"], first["spec_json"]
    cfgs = []
    if args.grid == "workers":
        modes = ["e2e"]
        cfgs = [{**c, "workload": w.name} for w in workloads for c in workers_configurations(ncpu)]
    elif "e2e" in modes:
        for w in workloads:
            cfgs += [{**c, "workload": w.name} for c in e2e_configurations(quick, ncpu)]
    # the worker stage: today's photos only
    if args.grid != "workers" and "worker" in modes and "photos" in data:
        cfgs += [{**c, "workload": "photos"}
                 for c in configurations(quick, ncpu, not args.no_scaling)]
    if args.only:
        keep = set(args.only.split(","))
        cfgs = [c for c in cfgs if c["family"] in keep]
    if any(c["family"] == "energon" for c in cfgs):
        from zephon_bench.energon_e2e import prepare

        # `energon prepare` on a copy (it writes .nv-meta/ beside the shards), outside the runs
        for base, d in data.items():
            edata = prepare(d["spec"], out / ("energon-data" if base == "photos"
                                              else f"energon-data-{base}"))
            for c in cfgs:
                if c["family"] == "energon" and c["workload"].removesuffix("+busy") == base:
                    c["params"] = {**c["params"], "data": str(edata)}
    progress.total = len(cfgs)
    progress.say(f"zephon-vl bench: {len(cfgs)} configurations x {reps} rep(s), workloads "
         + ", ".join(f"{w.name} ({data[w.base]['info']['samples']} samples)" for w in workloads)
         + f", {ncpu} cores, "
         f"PIL {machine['pillow_backend']}; logs in {logdir}")
    from zephon_bench.measure import NCPU, machine_busy_seconds

    b0, t0 = machine_busy_seconds(), time.monotonic()
    time.sleep(2.0)
    load_before = (machine_busy_seconds() - b0) / (NCPU * (time.monotonic() - t0))
    if load_before > args.max_outside_load:
        _warn(progress, f"  warning: the machine is {100 * load_before:.0f}% busy before the "
              "benchmark starts; expect disturbed runs (figures are then noisy, CPU ms/sample "
              "less so)")
    runs: dict[str, list[dict]] = {_key(c): [] for c in cfgs}
    failures: list[str] = []
    retry_budget = [retries]

    wait_each = args.wait_quiet if args.wait_quiet is not None else (0.0 if quick else 15.0)
    wait_left = [10 * wait_each]

    def wait_for_quiet() -> None:
        """Let a burst of other load pass (bounded): fewer runs come out disturbed."""
        deadline = time.monotonic() + min(wait_each, wait_left[0])
        while time.monotonic() < deadline:
            b, t = machine_busy_seconds(), time.monotonic()
            time.sleep(1.0)
            if (machine_busy_seconds() - b) / (NCPU * (time.monotonic() - t)) \
                    <= args.max_outside_load:
                break
            wait_left[0] -= time.monotonic() - t

    def measure(cfg: dict, rep: int) -> None:
        attempt = 0
        while True:
            if wait_each > 0:
                wait_for_quiet()
            tag = f"r{rep}-a{attempt}-{cfg['workload']}-{cfg['mode']}-" + "".join(
                ch if ch.isalnum() else "_" for ch in cfg["name"])
            d = data[cfg["workload"].removesuffix("+busy")]
            busy = cfg["workload"].endswith("+busy")
            if cfg["mode"] == "e2e":
                r = run_one(cfg, d["e2e_spec"], logdir, timeout, tag, warm, E2E_END_FRAC,
                            busy=busy)
            else:
                r = run_one(cfg, d["spec_json"], logdir, timeout, tag, warm, busy=busy)
            if not r["ok"]:
                failures.append(f"{cfg['name']} (rep {rep}): {r['error']}\n{r['log_tail']}")
                _warn(progress, f"  FAILED {cfg['name']}: {r['error']}")
                progress.advance()
                return
            m = r["metrics"]
            r["disturbed"] = m["outside_load"] > args.max_outside_load
            r["rep"], r["attempt"] = rep, attempt
            runs[_key(cfg)].append(r)
            report_run(progress, f"rep {rep} {_key(cfg)}", m, r["disturbed"],
                       time.monotonic() - t_begin)
            if not r["disturbed"] or retry_budget[0] <= 0 or attempt >= 1:
                return
            retry_budget[0] -= 1
            attempt += 1
            progress.total += 1

    # phase 1: every configuration once; phase 2: the default and each loader's best of
    # phase 1 again, `reps - 1` times, interleaved (so a slow spell hits them all alike)
    for cfg in cfgs:
        measure(cfg, 0)
    finals = [c for c in cfgs if c["name"] == "zephon default"]
    if args.grid == "workers":  # the comparison itself: every configuration, every rep
        finals = list(cfgs)
    for scope in dict.fromkeys((c["workload"], c["mode"]) for c in cfgs):
        for fam in FAMILIES:
            cands = [c for c in cfgs if (c["workload"], c["mode"]) == scope
                     and c["family"] == fam and runs[_key(c)]]
            if cands:
                top = max(cands, key=lambda c: _median(_usable(runs[_key(c)]), "samples_per_s"))
                if top not in finals:
                    finals.append(top)
    progress.total = len(cfgs) + (reps - 1) * len(finals)
    for rep in range(1, reps):
        order = finals[rep % len(finals):] + finals[:rep % len(finals)]
        for cfg in order:
            measure(cfg, rep)
    breakdown = None
    if not args.no_breakdown:
        from zephon_bench.breakdown import run_breakdown

        breakdown = run_breakdown(spec, 60 if quick else 200)
        progress.say(f"  breakdown: {breakdown['total_ms_per_sample']:.2f} ms/sample in one "
                     "process")

    # --- checks: the same samples and tokens for every run -----------------------------
    mismatches = check_tallies(runs)
    # --- summary ------------------------------------------------------------------------
    configs_out = [{**c, "runs": [{"rep": r["rep"], "attempt": r["attempt"],
                                   "disturbed": r["disturbed"], **r["metrics"],
                                   "plan": r["extra"].get("plan"),
                                   "auto_changes": r["extra"].get("auto_changes"),
                                   "tally": r["tally"]} for r in runs[_key(c)]]}
                   for c in cfgs]
    tally = runs[_key(cfgs[0])][0]["tally"] if cfgs and runs[_key(cfgs[0])] else {}
    first_name = workloads[0].name
    report = {
        "format": "zephon-vl-bench", "version": 1,
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "mode": "quick" if quick else "full", "reps": reps, "machine": machine,
        "command": " ".join(["zephon-vl", "bench", *sys.argv[2:]]) if sys.argv[1:2] == ["bench"]
        else " ".join(sys.argv),
        "settings": {**spec_json, **first["info"], "delivered": tally,
                     "workload": first_name,
                     "max_outside_load": args.max_outside_load, "warmup": warm,
                     "machine_load_before": load_before,
                     "e2e_epochs": first["e2e_spec"]["epochs"],
                     "e2e_window": [warm, E2E_END_FRAC]},
        "configs": [c for c in configs_out if c["mode"] == "worker"],
        # the first workload's delivered-batch runs (``photos`` unless --workload says)
        "e2e_configs": [c for c in configs_out if c["mode"] == "e2e"
                        and c["workload"] == first_name],
        "workloads": {w.name: {
            "busy_neighbour": w.busy,
            "settings": {**data[w.base]["spec_json"], **data[w.base]["info"],
                         "e2e_epochs": data[w.base]["e2e_spec"]["epochs"]},
            "e2e_configs": [c for c in configs_out if c["mode"] == "e2e"
                            and c["workload"] == w.name]} for w in workloads},
        "scaling": {} if args.no_scaling or "worker" not in modes else None,
        "breakdown": breakdown,
        "checks": {"ok": not mismatches and not failures, "same_samples_and_tokens":
                   not mismatches, "mismatches": mismatches, "failures": failures},
        "elapsed_s": time.monotonic() - t_begin,
    }
    summarize(report)
    text = portable(json.dumps(report, indent=1))
    (out / "bench.json").write_text(text)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(text)
    md = markdown(report)
    (out / "bench.md").write_text(md)
    try:
        charts(report, out)
    except Exception as exc:  # noqa: BLE001 - the numbers matter more than the picture
        _say(f"  (chart failed: {exc})")
    _print_results(md, report)
    _say(f"zephon-vl bench: {report['elapsed_s']:.0f} s; wrote {out / 'bench.json'}, "
         f"{out / 'bench.md'} and the charts")
    if mismatches or failures:
        for line in mismatches + failures:
            _say(f"ERROR: {line}")
        _say("zephon-vl bench: FAILED: the loaders did not all deliver the same samples and "
             "tokens, or a run failed (see above)")
        return 3
    shutil.rmtree(logdir, ignore_errors=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        return child_main(argv[1], argv[3])
    p = argparse.ArgumentParser(prog="python -m zephon_bench.vlm_bench",
                                description=__doc__.split("\n")[0])
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
