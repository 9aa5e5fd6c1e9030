"""Watching a benchmark process from outside: CPU and memory of its tree, load of the machine.

`TreeMonitor` polls (every `interval` s) the CPU time and resident memory of
a process and all its descendants, the machine-wide busy time from
``/proc/stat`` and this (the watching) process's own CPU time. From that
series and the batch timestamps a run reports, `metrics` computes the
figures of one run: steady-state rates, time to first batch, CPU seconds per
sample, peak memory, and how busy the machine was *outside* the benchmark's
processes (other jobs, steal time), which flags a disturbed run.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import psutil

now = time.monotonic
CLK_TCK = os.sysconf("SC_CLK_TCK")
NCPU = os.cpu_count() or 1


def machine_busy_seconds() -> float:
    """CPU-seconds the whole machine has been busy (steal included: time we did not get)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    user, nice, system, idle, iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    return (user + nice + system + irq + softirq + steal) / CLK_TCK


def shmem_bytes() -> int:
    """Shared memory (tmpfs, /dev/shm) in use on the machine: arrays in flight between
    processes live there, and a process's RSS counts such pages only once it touches them."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("Shmem:"):
                return int(line.split()[1]) * 1024
    return 0


def fork_logged(log_path: os.PathLike | str, run: Callable[[], int]) -> int:
    """Fork a child that runs `run` in a session of its own with its output in `log_path`,
    and leaves with `run`'s exit code without the parent's atexit handlers; its pid.

    One measured configuration a child, so no run inherits another's warm caches, pools
    or threads, and the monitor sees exactly that run's process tree."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.setsid()
        code = run()
    except BaseException:  # noqa: BLE001 - the log says what went wrong
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


@dataclass
class Series:
    t: list[float] = field(default_factory=list)
    tree_cpu: list[float] = field(default_factory=list)
    tree_rss: list[float] = field(default_factory=list)
    tree_pss: list[float] = field(default_factory=list)
    machine_busy: list[float] = field(default_factory=list)
    self_cpu: list[float] = field(default_factory=list)
    tree_procs: list[int] = field(default_factory=list)
    shm: list[float] = field(default_factory=list)
    root_cpu: list[float] = field(default_factory=list)
    #: CPU seconds of the processes asked to run beside the tree (the busy neighbour)
    neighbour_cpu: list[float] = field(default_factory=list)

    def at(self, name: str, t: float) -> float:
        return float(np.interp(t, self.t, getattr(self, name)))


class TreeMonitor(threading.Thread):
    """Polls a process tree until the root exits (or `stop()`); `neighbours`: processes
    that run beside it on purpose (their CPU is neither the tree's nor outside load)."""

    def __init__(self, pid: int, interval: float = 0.2,
                 neighbours: tuple[int, ...] = ()) -> None:
        super().__init__(name="bench-monitor", daemon=True)
        self.root = psutil.Process(pid)
        self.interval = interval
        self.series = Series()
        self._procs: dict[int, psutil.Process] = {pid: self.root}
        self._cpu: dict[int, float] = {}
        self._halt = threading.Event()
        self._neighbours = [psutil.Process(p) for p in neighbours]
        self._neighbour_cpu: dict[int, float] = {}
        self.poll()

    def poll(self) -> None:
        try:
            for child in self.root.children(recursive=True):
                if child.pid not in self._procs:
                    self._procs[child.pid] = child
        except psutil.Error:
            pass
        rss = pss = 0
        alive = 0
        for pid, proc in list(self._procs.items()):
            try:
                with proc.oneshot():
                    ct = proc.cpu_times()
                    mem = proc.memory_full_info()
                self._cpu[pid] = ct.user + ct.system  # dead processes keep their last value
                rss += mem.rss
                pss += mem.pss
                alive += 1
            except psutil.Error:
                self._procs.pop(pid, None)
        s = self.series
        s.t.append(now())
        s.tree_cpu.append(sum(self._cpu.values()))
        s.tree_rss.append(rss)
        s.tree_pss.append(pss)
        s.machine_busy.append(machine_busy_seconds())
        s.self_cpu.append(time.process_time())
        s.tree_procs.append(alive)
        s.shm.append(shmem_bytes())
        s.root_cpu.append(self._cpu.get(self.root.pid, 0.0))
        for proc in self._neighbours:
            try:
                ct = proc.cpu_times()
                self._neighbour_cpu[proc.pid] = ct.user + ct.system
            except psutil.Error:
                pass
        s.neighbour_cpu.append(sum(self._neighbour_cpu.values()))

    def run(self) -> None:
        while not self._halt.wait(self.interval):
            self.poll()
            if not self.root.is_running() or self.root.status() == psutil.STATUS_ZOMBIE:
                break

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=5)
        self.poll()


def steady_window(events: list[list[float]], warm_frac: float = 0.2,
                  end_frac: float = 0.9) -> tuple[int, int]:
    """Indices (a, b) of the events bounding the steady state: events (a, b] are measured.

    Warm-up: the first event and at least `warm_frac` of the samples (worker
    start-up, caches). The end: nothing past `end_frac` of the samples (the
    ramp-down while the last workers run out of work).
    """
    n = len(events)
    if n < 2:
        return 0, max(n - 1, 0)
    cum = np.cumsum([e[1] for e in events])
    total = cum[-1]
    a = max(int(np.searchsorted(cum, warm_frac * total)), 0)
    b = int(np.searchsorted(cum, end_frac * total, side="right")) - 1
    a = min(a, n - 2)
    b = min(max(b, a + 1), n - 1)
    return a, b


def metrics(result: dict, series: Series, warm_frac: float = 0.2,
            end_frac: float = 0.9) -> dict:
    """The figures of one run from its production curve, batch times and the monitor's series."""
    ev = result["produced"]
    t0, t_end = result["t_start"], result["t_end"]
    a, b = steady_window(ev, warm_frac, end_frac)
    win = ev[a + 1:b + 1]
    ta, tb = ev[a][0], ev[b][0]
    dt = max(tb - ta, 1e-9)
    samples = sum(e[1] for e in win)
    tokens = sum(e[2] for e in win)
    images = sum(e[3] for e in win)
    cpu_win = series.at("tree_cpu", tb) - series.at("tree_cpu", ta)
    total_wall = t_end - t0
    tree_all = series.at("tree_cpu", t_end) - series.at("tree_cpu", t0)
    busy_all = series.at("machine_busy", t_end) - series.at("machine_busy", t0)
    self_all = series.at("self_cpu", t_end) - series.at("self_cpu", t0)
    nb_all = nb_w = 0.0
    if series.neighbour_cpu:
        nb_all = series.at("neighbour_cpu", t_end) - series.at("neighbour_cpu", t0)
        nb_w = series.at("neighbour_cpu", tb) - series.at("neighbour_cpu", ta)
    outside = max(0.0, busy_all - tree_all - self_all - nb_all) / (NCPU * max(total_wall, 1e-9))
    busy_w = series.at("machine_busy", tb) - series.at("machine_busy", ta)
    self_w = series.at("self_cpu", tb) - series.at("self_cpu", ta)
    outside_w = max(0.0, busy_w - cpu_win - self_w - nb_w) / (NCPU * dt)
    tally = result["tally"]
    # zephon's delivered-batch runs: its last process stage's rate over the same window
    groups = result.get("extra", {}).get("stage_groups")
    stage = sum(n for t, n in groups if ta < t <= tb) / dt if groups else None
    return {
        "stage_samples_per_s": stage,
        "samples_per_s": samples / dt,
        "tokens_per_s": tokens / dt,
        "images_per_s": images / dt,
        "ttfb_s": (result["t_first"] - t0) if result["t_first"] is not None else None,
        "cpu_s_per_sample": cpu_win / samples if samples else None,
        "cores_used": cpu_win / dt,
        "main_cpu_s_per_sample": (series.at("root_cpu", tb) - series.at("root_cpu", ta))
        / samples if samples else None,
        "peak_rss_mb": max(series.tree_rss) / 2**20 if series.tree_rss else None,
        "peak_shm_mb": (max(series.shm) - series.shm[0]) / 2**20 if series.shm else None,
        # PSS: a page mapped by k processes counts 1/k in each, so the sum counts it once
        # (shared-memory files included while mapped); forked pages shared with the
        # harness count in part
        "peak_mem_mb": max(series.tree_pss) / 2**20 if series.tree_pss else None,
        "outside_load": outside,
        "outside_load_steady": outside_w,
        "steady_samples": samples,
        "steady_seconds": dt,
        "wall_s": total_wall,
        "overall_samples_per_s": tally["samples"] / max(total_wall, 1e-9),
        "cpu_s_total": tree_all,
        # the busy neighbour's share of the machine over the run (0 without one)
        "neighbour_cores": nb_all / max(total_wall, 1e-9),
    }
